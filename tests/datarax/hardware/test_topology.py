"""Hardware plans' device order (datarax.hardware.topology) against JAX's own.

Three references, strongest first:

- the real TPU topology: with ``jax[tpu]`` (libtpu) installed,
  ``jax.experimental.topologies.get_topology_desc`` builds the devices of a TPU slice on
  this CPU-only host and ``mesh_utils.create_device_mesh`` /
  ``create_hybrid_device_mesh`` order them. That runs in one subprocess (so the test
  process's 8 simulated CPU devices are untouched) and every device's id, chip
  coordinates, slice, process and core is compared position by position. Without
  libtpu these tests skip loudly, and fail when ``CI=true``;
- ``mesh_utils`` on plain stand-in device records (the attributes it reads: ``coords``,
  ``core_on_chip``, ``device_kind``, ``platform``, ``slice_index``, ``id``), which needs
  no libtpu and checks the ordering logic for TPU and GPU;
- properties that hold by construction (ici axes inside a slice or NVLink domain,
  link classes, bandwidths from the catalog) and every refusal's code.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest
from jax.experimental import mesh_utils

from datarax.errors import PlanError
from datarax.hardware.chips import get_hardware
from datarax.hardware.topology import (
    MULTI_SLICE_ID_STRIDE,
    plan_hardware_devices,
)

# ------------------------------------------------------------------- libtpu subprocess

_JAX_TOPOLOGY_SCRIPT = r"""
import json, sys
from jax.experimental import mesh_utils, topologies

out = []
for hw, topo, slices, ici, dcn, split in json.load(sys.stdin):
    # v4 exposes both cores of a chip unless asked for megacore, JAX's default mode there.
    kwargs = {"chip_config_name": "megacore"} if hw == "tpu-v4" else {}
    name = hw.removeprefix("tpu-") + ":" + topo
    devices = topologies.get_topology_desc(
        platform="tpu", topology_name=name, num_slices=slices, **kwargs).devices
    sizes = [size for _, size in ici]
    try:
        if slices == 1:
            grid = mesh_utils.create_device_mesh(
                sizes, devices, allow_split_physical_axes=split)
        else:
            dcn_sizes = [dict(dcn).get(axis, 1) for axis, _ in ici]
            grid = mesh_utils.create_hybrid_device_mesh(
                sizes, dcn_sizes, devices, allow_split_physical_axes=split)
    except Exception as error:
        out.append({"error": type(error).__name__, "message": str(error)})
        continue
    flat = list(grid.flat)
    out.append({
        "shape": list(grid.shape),
        "ids": [d.id for d in flat],
        "coords": [list(d.coords) for d in flat],
        "core": [d.core_on_chip for d in flat],
        "slice": [getattr(d, "slice_index", 0) for d in flat],
        "process": [d.process_index for d in flat],
    })
json.dump(out, sys.stdout)
"""


def _require_libtpu() -> None:
    """Skip loudly without libtpu; fail under CI, where `make test` installs it."""
    if importlib.util.find_spec("libtpu") is None:
        message = (
            "libtpu is not installed: the TPU device-order tests against JAX's real TPU "
            "topologies cannot run. Install it with "
            "`.venv/bin/pip install -c constraints.txt 'jax[tpu]==0.12.0.1'`"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)


def _run_jax_topologies(cases: list[tuple]) -> list[dict]:
    """JAX's own mesh for every case, computed in a fresh process over real topologies."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", TPU_SKIP_MDS_QUERY="1")
    payload = [(hw, topo, slices, list(ici.items()), list(dcn.items()), split)
               for hw, topo, slices, ici, dcn, split in cases]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", _JAX_TOPOLOGY_SCRIPT],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, f"JAX topology subprocess failed:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout)


def _assert_same_as_jax(case: tuple, jax_result: dict) -> None:
    hw, topo, slices, ici, dcn, split = case
    layout = plan_hardware_devices(
        hw, topology=topo, slices=slices, ici=ici, dcn=dcn, allow_split_physical_axes=split
    )
    assert list(layout.device_grid.shape) == jax_result["shape"], case
    np.testing.assert_array_equal(layout.device_ids, jax_result["ids"], err_msg=str(case))
    np.testing.assert_array_equal(layout.physical, jax_result["coords"], err_msg=str(case))
    np.testing.assert_array_equal(layout.slice_index, jax_result["slice"], err_msg=str(case))
    np.testing.assert_array_equal(layout.host_index, jax_result["process"], err_msg=str(case))
    np.testing.assert_array_equal(layout.core, jax_result["core"], err_msg=str(case))


# (id, (hardware, topology, slices, ici, dcn, allow_split_physical_axes))
ORDER_CASES = [
    ("v5e-16x16-fsdp-tensor", ("tpu-v5e", "16x16", 1, {"fsdp": 16, "tensor": 16}, {}, False)),
    ("v5e-16x16-split", ("tpu-v5e", "16x16", 1, {"data": 1, "fsdp": 64, "tensor": 4}, {}, True)),
    ("v5e-8x16", ("tpu-v5e", "8x16", 1, {"data": 8, "model": 16}, {}, False)),
    ("v5e-4x4-ring", ("tpu-v5e", "4x4", 1, {"data": 16, "model": 1}, {}, False)),
    ("v5e-4x4-grid", ("tpu-v5e", "4x4", 1, {"data": 4, "model": 4}, {}, False)),
    ("v5e-2x4-ring-3d", ("tpu-v5e", "2x4", 1, {"a": 2, "b": 2, "c": 2}, {}, False)),
    ("v5e-2x2-ring", ("tpu-v5e", "2x2", 1, {"data": 4}, {}, False)),
    ("v5e-1x1", ("tpu-v5e", "1x1", 1, {"data": 1, "model": 1}, {}, False)),
    ("v6e-8x8", ("tpu-v6e", "8x8", 1, {"data": 8, "model": 8}, {}, False)),
    ("v6e-4x8-split", ("tpu-v6e", "4x8", 1, {"data": 2, "fsdp": 8, "tensor": 2}, {}, True)),
    ("v4-4x4x4-16x4", ("tpu-v4", "4x4x4", 1, {"data": 16, "model": 4}, {}, False)),
    ("v4-4x4x4-4x16", ("tpu-v4", "4x4x4", 1, {"data": 4, "model": 16}, {}, False)),
    ("v4-4x4x4-cube", ("tpu-v4", "4x4x4", 1, {"a": 4, "b": 4, "c": 4}, {}, False)),
    ("v4-4x4x4-split", ("tpu-v4", "4x4x4", 1, {"data": 2, "model": 32}, {}, True)),
    ("v4-2x2x2", ("tpu-v4", "2x2x2", 1, {"data": 2, "model": 4}, {}, False)),
    ("v5p-2x2x2-ring", ("tpu-v5p", "2x2x2", 1, {"data": 2, "model": 4}, {}, False)),
    ("v5p-4x8x8", ("tpu-v5p", "4x8x8", 1, {"data": 4, "model": 64}, {}, False)),
    ("v5p-4x4x8-split", ("tpu-v5p", "4x4x8", 1, {"a": 8, "b": 2, "c": 8}, {}, True)),
    # TPU7x: two devices per chip; JAX rings trays of 8, then puts the core axis first
    ("7x-2x2x1-ring", ("tpu7x", "2x2x1", 1, {"data": 2, "model": 4}, {}, False)),
    ("7x-2x2x4-ring", ("tpu7x", "2x2x4", 1, {"data": 8, "model": 4}, {}, False)),
    ("7x-4x4x4-core", ("tpu7x", "4x4x4", 1, {"data": 4, "fsdp": 16, "tensor": 2}, {}, False)),
    ("7x-4x4x4-split", ("tpu7x", "4x4x4", 1, {"data": 2, "model": 64}, {}, True)),
    ("7x-4x4x4-x2", ("tpu7x", "4x4x4", 2, {"data": 16, "model": 8}, {"data": 2}, False)),
    ("v5e-4x4-x2-dcn-data", ("tpu-v5e", "4x4", 2, {"data": 4, "model": 4}, {"data": 2}, False)),
    (
        "v6e-16x16-x2",
        ("tpu-v6e", "16x16", 2, {"data": 1, "fsdp": 16, "tensor": 16}, {"data": 2}, False),
    ),  # fmt: skip
    (
        "v5e-4x4-x4-dcn-2x2",
        ("tpu-v5e", "4x4", 4, {"a": 2, "b": 4, "c": 2}, {"a": 2, "b": 2}, True),
    ),  # fmt: skip
    (
        "v4-4x4x4-x2-dcn-inner",
        ("tpu-v4", "4x4x4", 2, {"data": 4, "model": 16}, {"model": 2}, False),
    ),  # fmt: skip
    (
        "v5p-2x2x4-x3",
        ("tpu-v5p", "2x2x4", 3, {"data": 1, "fsdp": 4, "tensor": 4}, {"data": 3}, False),
    ),  # fmt: skip
    (
        "v4-2x4x4-x4-split",
        ("tpu-v4", "2x4x4", 4, {"data": 1, "fsdp": 8, "tensor": 4}, {"data": 4}, True),
    ),  # fmt: skip
]

# Requests JAX refuses (NotImplementedError: a mesh axis needs a split physical axis).
REFUSED_CASES = [
    (
        "v5e-16x16-tensor4",
        ("tpu-v5e", "16x16", 1, {"data": 1, "fsdp": 64, "tensor": 4}, {}, False),
        4,
    ),  # fmt: skip
    ("v4-4x4x4-2x32", ("tpu-v4", "4x4x4", 1, {"data": 2, "model": 32}, {}, False), 32),
    ("v5p-4x4x8-8x2x8", ("tpu-v5p", "4x4x8", 1, {"a": 8, "b": 2, "c": 8}, {}, False), 2),
    ("v6e-8x16-x2", ("tpu-v6e", "8x16", 2, {"data": 32, "model": 4}, {"data": 2}, False), 4),
]


def _sweep_cases() -> list[tuple]:
    """Every 2- and 3-axis ici factorisation of a few slices, with and without splits."""
    cases = []
    for hw, topo in [("tpu-v5e", "4x8"), ("tpu-v4", "4x4x4"), ("tpu-v5p", "2x4x4")]:
        n = math.prod(int(d) for d in topo.split("x"))
        divisors = [d for d in range(1, n + 1) if n % d == 0]
        shapes = [(a, n // a) for a in divisors]
        shapes += [(a, b, n // (a * b)) for a in divisors for b in divisors if n % (a * b) == 0]
        for shape, split in itertools.product(shapes, (False, True)):
            ici = dict(zip("abc", shape, strict=False))
            cases.append((hw, topo, 1, ici, {}, split))
    return cases


@pytest.fixture(scope="module")
def jax_meshes() -> dict[str, object]:
    """JAX's meshes for all libtpu cases, computed once in one subprocess."""
    _require_libtpu()
    named = [case for _, case in ORDER_CASES] + [case for _, case, _ in REFUSED_CASES]
    sweep = _sweep_cases()
    results = _run_jax_topologies(named + sweep)
    by_id = [name for name, _ in ORDER_CASES] + [name for name, _, _ in REFUSED_CASES]
    return {
        "named": dict(zip(by_id, results[: len(named)], strict=True)),
        "sweep": list(zip(sweep, results[len(named) :], strict=True)),
    }


@pytest.mark.parametrize("case", [c for _, c in ORDER_CASES], ids=[n for n, _ in ORDER_CASES])
def test_tpu_order_equals_jax_on_real_topology(case, jax_meshes, request):
    result = jax_meshes["named"][request.node.callspec.id]
    assert "error" not in result, f"JAX refused {case}: {result}"
    _assert_same_as_jax(case, result)


@pytest.mark.parametrize(
    ("case", "size"),
    [(c, s) for _, c, s in REFUSED_CASES],
    ids=[n for n, _, _ in REFUSED_CASES],
)
def test_tpu_refusals_equal_jax(case, size, jax_meshes, request):
    result = jax_meshes["named"][request.node.callspec.id]
    assert result.get("error") == "NotImplementedError", result
    assert f"of size {size} " in result["message"]
    assert "allow_split_physical_axes" in result["message"]
    hw, topo, slices, ici, dcn, split = case
    with pytest.raises(PlanError) as caught:
        plan_hardware_devices(
            hw, topology=topo, slices=slices, ici=ici, dcn=dcn, allow_split_physical_axes=split
        )
    assert caught.value.code == "physical_axes_split_required"
    assert f"of size {size} " in caught.value.message
    assert "allow_split_physical_axes" in caught.value.message
    # The same request with splitting allowed is accepted by both.
    plan_hardware_devices(
        hw, topology=topo, slices=slices, ici=ici, dcn=dcn, allow_split_physical_axes=True
    )


def test_every_factorisation_agrees_with_jax(jax_meshes):
    agreed = refused = 0
    for case, result in jax_meshes["sweep"]:
        hw, topo, slices, ici, dcn, split = case
        if "error" in result:
            assert result["error"] == "NotImplementedError", (case, result)
            with pytest.raises(PlanError, match="allow_split_physical_axes") as caught:
                plan_hardware_devices(hw, topology=topo, slices=slices, ici=ici, dcn=dcn,
                                      allow_split_physical_axes=split)  # fmt: skip
            assert caught.value.code == "physical_axes_split_required", case
            refused += 1
        else:
            _assert_same_as_jax(case, result)
            agreed += 1
    assert agreed > 100 and refused > 20, (agreed, refused)


# --------------------------------------------------- mesh_utils on stand-in devices


@dataclass(frozen=True)
class StandInDevice:
    """The attributes of a ``jax.Device`` that ``mesh_utils`` reads, nothing else."""

    id: int
    coords: tuple[int, int, int]
    core_on_chip: int
    slice_index: int
    process_index: int
    device_kind: str
    platform: str


def _tpu_stand_ins(hw: str, chips: tuple[int, int, int], slices: int) -> list[StandInDevice]:
    kind = get_hardware(hw).device_kind
    n = math.prod(chips)
    out = []
    for s, local in itertools.product(range(slices), range(n)):
        x, y, z = local % chips[0], local // chips[0] % chips[1], local // (chips[0] * chips[1])
        out.append(StandInDevice(s * n + local, (x, y, z), 0, s, 0, kind, "tpu"))
    # mesh_utils must not depend on the order devices come in.
    return out[::-1]


STAND_IN_CASES = [
    ("v5e-16x16", "tpu-v5e", (16, 16, 1), 1, (16, 16), (1, 1), False),
    ("v5e-4x4-ring", "tpu-v5e", (4, 4, 1), 1, (1, 16), (1, 1), False),
    ("v5e-2x4-ring", "tpu-v5e", (2, 4, 1), 2, (4, 2), (2, 1), False),
    ("v6e-2x2-ring", "tpu-v6e", (2, 2, 1), 3, (2, 2), (1, 3), False),
    ("v5p-2x2x2-ring", "tpu-v5p", (2, 2, 2), 1, (8,), (1,), False),
    ("v4-8x8x8", "tpu-v4", (8, 8, 8), 1, (8, 64), (1, 1), False),
    ("v4-4x4x8-split", "tpu-v4", (4, 4, 8), 2, (2, 4, 2, 8), (2, 1, 1, 1), True),
    ("v5p-4x8x8-split", "tpu-v5p", (4, 8, 8), 1, (2, 32, 4), (1, 1, 1), True),
]


@pytest.mark.parametrize(
    ("hw", "chips", "slices", "ici", "dcn", "split"),
    [c[1:] for c in STAND_IN_CASES],
    ids=[c[0] for c in STAND_IN_CASES],
)
def test_tpu_order_equals_mesh_utils_on_stand_ins(hw, chips, slices, ici, dcn, split):
    devices = _tpu_stand_ins(hw, chips, slices)
    if slices == 1:
        grid = mesh_utils.create_device_mesh(ici, devices, allow_split_physical_axes=split)
    else:
        grid = mesh_utils.create_hybrid_device_mesh(
            ici, dcn, devices, allow_split_physical_axes=split
        )
    names = [f"a{i}" for i in range(len(ici))]
    topology = "x".join(map(str, chips if hw in ("tpu-v4", "tpu-v5p") else chips[:2]))
    layout = plan_hardware_devices(
        hw,
        topology=topology,
        slices=slices,
        ici=dict(zip(names, ici, strict=True)),
        dcn=dict(zip(names, dcn, strict=True)),
        allow_split_physical_axes=split,
    )
    assert layout.device_grid.shape == grid.shape
    np.testing.assert_array_equal(layout.physical, [d.coords for d in grid.flat])
    np.testing.assert_array_equal(layout.slice_index, [d.slice_index for d in grid.flat])
    assert layout.split_physical_axes == split


GPU_CASES = [
    ("h100-4-hosts", "h100-sxm", 4, {"fsdp": 2, "tensor": 4}, {"fsdp": -1}),
    ("h200-2-hosts-dcn-outer", "h200-sxm", 2, {"data": 1, "fsdp": 8}, {"data": 2}),
    ("b200-3-hosts", "b200", 3, {"data": 2, "tensor": 4}, {"data": 3}),
    ("gb200-2-domains", "gb200-nvl72", 36, {"data": 1, "fsdp": 18, "tensor": 4}, {"data": 2}),
    ("gb200-1-domain", "gb200-nvl72", 18, {"fsdp": -1, "tensor": 8}, None),
]


@pytest.mark.parametrize(
    ("hw", "hosts", "ici", "dcn"), [c[1:] for c in GPU_CASES], ids=[c[0] for c in GPU_CASES]
)
def test_gpu_order_equals_mesh_utils_and_stays_in_nvlink_domains(hw, hosts, ici, dcn):
    entry = get_hardware(hw)
    layout = plan_hardware_devices(hw, hosts=hosts, ici=ici, dcn=dcn)
    per_host, per_domain = entry.devices_per_host, entry.fast_domain_devices
    devices = [
        StandInDevice(i, (0, 0, 0), 0, i // per_domain, i // per_host, entry.device_kind, "gpu")
        for i in range(hosts * per_host)
    ][::-1]
    grid = mesh_utils.create_hybrid_device_mesh(
        list(layout.ici.values()), list(layout.dcn.values()), devices
    )
    np.testing.assert_array_equal(layout.device_grid, np.vectorize(lambda d: d.id)(grid))
    np.testing.assert_array_equal(layout.host_index, [d.process_index for d in grid.flat])
    np.testing.assert_array_equal(layout.physical[:, 0], layout.host_index)
    np.testing.assert_array_equal(layout.physical[:, 1], layout.device_ids % per_host)
    assert layout.core is None and layout.topology is None
    # Every ici block (one dcn position) is exactly one NVLink domain.
    block = layout.device_grid.reshape(
        [v for d, i in zip(layout.dcn.values(), layout.ici.values(), strict=True) for v in (d, i)]
    )
    ici_dims = tuple(range(1, block.ndim, 2))
    domains = block // per_domain
    assert (domains.min(axis=ici_dims) == domains.max(axis=ici_dims)).all()
    assert sorted(np.unique(layout.slice_index).tolist()) == list(range(layout.slices))


# ------------------------------------------------------------------- links, bandwidths


def test_axes_detail_tpu_links_and_bandwidths():
    hw = get_hardware("tpu-v5p")
    layout = plan_hardware_devices(
        hw, topology="4x4x4", slices=2,
        ici={"data": 1, "fsdp": 16, "tensor": 4}, dcn={"data": 2},
    )  # fmt: skip
    detail = {axis.name: axis for axis in layout.axes_detail}
    assert [axis.name for axis in layout.axes_detail] == ["data", "fsdp", "tensor"]
    # JAX puts the last axis (4) on the first whole physical axis that fits (x) and
    # fsdp (16) on y, z; 4x4x4 wraps around in every dimension: 2 links per dimension.
    assert layout.axes_physical == {"data": (1, 1, 1), "fsdp": (1, 4, 4), "tensor": (4, 1, 1)}
    assert detail["fsdp"].link == "ici"
    assert detail["fsdp"].bytes_per_s == 4 * hw.fast_link_bytes_per_s
    assert detail["tensor"].bytes_per_s == 2 * hw.fast_link_bytes_per_s
    assert (detail["data"].link, detail["data"].size, detail["data"].dcn) == ("dcn", 2, 2)
    assert detail["data"].bytes_per_s == hw.slow_link_bytes_per_s / hw.devices_per_host
    assert detail["data"].ici_bytes_per_s is None


def test_axes_detail_open_mesh_has_one_link_per_dimension():
    hw = get_hardware("tpu-v5e")
    layout = plan_hardware_devices(hw, topology="4x8", ici={"data": 4, "model": 8})
    # v5e wraps only a dimension of 16; a 4x8 slice is an open mesh.
    assert layout.axes_physical == {"data": (4, 1, 1), "model": (1, 8, 1)}
    assert all(a.bytes_per_s == hw.fast_link_bytes_per_s for a in layout.axes_detail)


def test_axes_detail_gpu_and_cpu_link_classes():
    hw = get_hardware("h100-sxm")
    layout = plan_hardware_devices(hw, hosts=4, ici={"fsdp": 2, "tensor": 4}, dcn={"fsdp": 4})
    fsdp, tensor = layout.axes_detail
    assert (fsdp.link, fsdp.size, fsdp.ici, fsdp.dcn) == ("infiniband", 8, 2, 4)
    assert fsdp.bytes_per_s == hw.slow_link_bytes_per_s / hw.devices_per_host
    assert fsdp.ici_bytes_per_s == hw.fast_link_bytes_per_s
    assert (tensor.link, tensor.bytes_per_s) == ("nvlink", hw.fast_link_bytes_per_s)
    cpu = plan_hardware_devices("cpu", hosts=2, ici={"data": 8}, dcn={"data": 2})
    assert [a.link for a in cpu.axes_detail] == [get_hardware("cpu").slow_link]


# ---------------------------------------------------------------------- ids and hosts


def test_multi_slice_ids_hosts_and_shape():
    layout = plan_hardware_devices(
        "tpu-v5e", topology="v5e:8x8", slices=3, ici={"data": 1, "model": 64},
        dcn={"data": -1},
    )  # fmt: skip
    assert layout.axes == {"data": 3, "model": 64}
    assert layout.topology == (8, 8, 1) and layout.topology_name == "v5e:8x8"
    x, y, z = layout.physical.T
    expected = (layout.slice_index + 1) * MULTI_SLICE_ID_STRIDE + x + 8 * (y + 8 * z)
    np.testing.assert_array_equal(layout.device_ids, expected)
    # 2x2 chips per host: 16 hosts per slice, numbered slice by slice.
    assert layout.hosts == 48
    np.testing.assert_array_equal(
        layout.host_index, layout.slice_index * 16 + x // 2 + 4 * (y // 2)
    )
    np.testing.assert_array_equal(layout.slice_index, np.repeat(np.arange(3), 64))
    assert (layout.core == 0).all()


def test_one_slice_ids_are_chip_indices():
    layout = plan_hardware_devices("tpu-v4", topology="2x2x4", ici={"data": -1, "model": 4})
    assert sorted(layout.device_ids.tolist()) == list(range(16))
    assert layout.hosts == 4 and (layout.slice_index == 0).all()


def test_65536_device_plan_is_consistent():
    # Its speed is measured by make bench (benchmarks/run.py), not asserted here.
    layout = plan_hardware_devices(
        "tpu-v5e", topology="16x16", slices=256,
        ici={"data": 1, "fsdp": 16, "tensor": 16}, dcn={"data": -1},
    )  # fmt: skip
    assert layout.num_devices == 65_536
    assert np.unique(layout.device_ids).size == 65_536
    assert np.bincount(layout.slice_index).tolist() == [256] * 256
    assert np.bincount(layout.host_index).tolist() == [4] * (64 * 256)
    # The data axis is the dcn axis: one slice per row.
    np.testing.assert_array_equal(
        layout.slice_index.reshape(256, -1), np.arange(256)[:, None].repeat(256, axis=1)
    )


# ------------------------------------------------------------------- parsing, refusals


# (id, hardware, keyword arguments, code)
BAD_REQUESTS = [
    ("unknown-hardware", "tpu-v9", {"topology": "2x2", "ici": {"d": 4}}, "unknown_hardware"),
    ("missing-topology", "tpu-v5e", {"ici": {"d": 4}}, "missing_topology"),
    ("bad-topology", "tpu-v5e", {"topology": "16by16", "ici": {"d": 4}}, "invalid_topology"),
    ("3d-on-v5e", "tpu-v5e", {"topology": "4x4x4", "ici": {"d": 4}}, "invalid_topology"),
    ("prefix-mismatch", "tpu-v5p", {"topology": "v5e:4x4", "ici": {"d": 16}},
     "invalid_topology"),
    ("topology-on-gpu", "h100-sxm", {"topology": "2x2", "hosts": 1, "ici": {"d": 8}},
     "option_not_applicable"),
    ("slices-on-gpu", "h100-sxm", {"slices": 2, "hosts": 2, "ici": {"d": 8}},
     "option_not_applicable"),
    ("hosts-on-tpu", "tpu-v5e", {"topology": "2x2", "hosts": 1, "ici": {"d": 4}},
     "option_not_applicable"),
    ("zero-slices", "tpu-v5e", {"topology": "2x2", "slices": 0, "ici": {"d": 4}},
     "invalid_slice_count"),
    ("missing-hosts", "h100-sxm", {"ici": {"d": 8}}, "invalid_host_count"),
    ("partial-nvl72", "gb200-nvl72", {"hosts": 9, "ici": {"d": 72}}, "invalid_host_count"),
    ("two-auto-ici", "tpu-v5e", {"topology": "4x4", "ici": {"a": -1, "b": -1}},
     "multiple_auto_axes"),
    ("two-auto-dcn", "tpu-v5e", {"topology": "2x2", "slices": 4, "ici": {"a": 2, "b": 2},
                                 "dcn": {"a": -1, "b": -1}}, "multiple_auto_axes"),
    ("ici-product", "tpu-v5e", {"topology": "4x4", "ici": {"a": 4, "b": 2}},
     "axes_product_mismatch"),
    ("dcn-product", "tpu-v5e", {"topology": "4x4", "slices": 3, "ici": {"a": 4, "b": 4},
                                "dcn": {"a": 2}}, "axes_product_mismatch"),
    ("dcn-unknown-axis", "tpu-v5e", {"topology": "4x4", "slices": 2, "ici": {"a": 16},
                                     "dcn": {"pipeline": 2}}, "unknown_dcn_axis"),
    ("bad-axis-name", "tpu-v5e", {"topology": "2x2", "ici": {"2d": 4}}, "invalid_axis_name"),
    ("bad-axis-size", "tpu-v5e", {"topology": "2x2", "ici": {"d": 0}}, "invalid_axis_size"),
    ("needs-split", "tpu-v5e", {"topology": "16x16", "ici": {"fsdp": 64, "tensor": 4}},
     "physical_axes_split_required"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("hardware", "kwargs", "code"), [c[1:] for c in BAD_REQUESTS], ids=[c[0] for c in BAD_REQUESTS]
)
def test_refusals_carry_codes(hardware, kwargs, code):
    with pytest.raises(PlanError) as caught:
        plan_hardware_devices(hardware, **kwargs)
    assert caught.value.code == code
    assert str(caught.value) == caught.value.message and len(caught.value.message) > 20


def test_a_missing_count_is_said_missing_not_none():
    # Issue 58, class 11: "hosts is None" said a Python value, not what to do.
    with pytest.raises(PlanError) as caught:
        plan_hardware_devices("h100-sxm", ici={"d": 8})
    assert caught.value.code == "invalid_host_count"
    assert "None" not in caught.value.message
    assert caught.value.message.startswith("hosts is missing; give an integer >= 1")
