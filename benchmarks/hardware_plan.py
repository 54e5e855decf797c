"""Time a 65,536-device hardware plan against JAX's own mesh for the same TPU topology.

Standalone (not part of ``make bench``)::

    .venv/bin/python -m benchmarks.hardware_plan [--repeats 5] [--json]

Measured, each as the median of ``--repeats`` runs in this process:

- ``datarax``: ``plan_hardware_devices("tpu-v5e", topology="16x16", slices=256, ...)``,
  the device order plus every device's id, slice, host and chip coordinates;
  ``datarax_split``: the same with ``ici={"data": 1, "fsdp": -1, "tensor": 4}`` and
  ``allow_split_physical_axes=True`` (the contract's example request);
- ``plain_plan``: today's abstract plan of the same mesh shape without hardware
  (``resolve_axes`` + ``mesh_device_ids`` + ``shard_index_ranges`` + ``replica_ids`` of a
  ``[65536, 1024]`` batch), for scale;
- with libtpu (``jax[tpu]``): ``jax_topology`` (``get_topology_desc`` of
  ``v5e:16x16`` x 256 slices) and ``jax_hybrid_mesh`` (``create_hybrid_device_mesh`` over
  those devices), then a check that both orders agree device by device.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from datarax.hardware.topology import plan_hardware_devices  # noqa: E402
from datarax.plan.layout import (  # noqa: E402
    batch_partition_spec,
    mesh_device_ids,
    replica_ids,
    resolve_axes,
    shard_index_ranges,
)

SLICES = 256
TOPOLOGY = "16x16"
ICI = {"data": 1, "fsdp": 16, "tensor": 16}
DCN = {"data": SLICES}


def _median(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def _plain_plan():
    axes = resolve_axes({"data": SLICES, "fsdp": 16, "tensor": 16}, SLICES * 256)
    spec = batch_partition_spec(axes, ["data", "fsdp"], 2)
    shape = (SLICES * 256, 1024)
    return mesh_device_ids(axes), shard_index_ranges(axes, spec, shape), replica_ids(axes, spec)


def _hardware_plan():
    return plan_hardware_devices("tpu-v5e", topology=TOPOLOGY, slices=SLICES, ici=ICI, dcn=DCN)


def _hardware_plan_split():
    return plan_hardware_devices(
        "tpu-v5e",
        topology=TOPOLOGY,
        slices=SLICES,
        ici={"data": 1, "fsdp": -1, "tensor": 4},
        dcn={"data": -1},
        allow_split_physical_axes=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    results: dict[str, object] = {"devices": SLICES * 256, "repeats": args.repeats}
    results["datarax_s"], layout = _median(_hardware_plan, args.repeats)
    results["datarax_split_s"], _ = _median(_hardware_plan_split, args.repeats)
    results["plain_plan_s"], _ = _median(_plain_plan, args.repeats)

    if importlib.util.find_spec("libtpu") is None:
        results["jax"] = "skipped: libtpu not installed (pip install 'jax[tpu]')"
    else:
        from jax.experimental import mesh_utils, topologies

        def topology():
            return topologies.get_topology_desc(
                platform="tpu", topology_name=f"v5e:{TOPOLOGY}", num_slices=SLICES
            ).devices

        results["jax_topology_s"], devices = _median(topology, args.repeats)

        def hybrid():
            return mesh_utils.create_hybrid_device_mesh(
                list(ICI.values()), [DCN.get(axis, 1) for axis in ICI], devices
            )

        results["jax_hybrid_mesh_s"], grid = _median(hybrid, args.repeats)
        flat = list(grid.flat)
        results["orders_agree"] = bool(
            np.array_equal(layout.device_ids, [d.id for d in flat])
            and np.array_equal(layout.physical, [d.coords for d in flat])
        )
        results["speedup_vs_jax_hybrid"] = results["jax_hybrid_mesh_s"] / results["datarax_s"]

    if args.json:
        print(json.dumps(results))
        return
    for key, value in results.items():
        shown = f"{value:.4f}" if isinstance(value, float) else value
        print(f"{key:>24}: {shown}")


if __name__ == "__main__":
    main()
