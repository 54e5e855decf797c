"""The memory estimate against XLA's compile-time figure for production-shaped runs.

Each run is a named model (7B-671B, dense and mixture-of-experts, sequences of 4k-128k
tokens split over context axes or not, ZeRO-1, MaxText's remat policies,
offload included) on a v5e, v5p or v6e topology that libtpu describes on this CPU-only
host. :func:`compile_run` compiles the step that compile checks compile
(``compile_step.compile_train_step``: the real transformer of ``datarax.models``) and
reads XLA's HBM allocation (``hbm_peak_bytes``) or its out-of-memory verdict;
:func:`compare` sets ``cost.memory_estimate`` beside it.

Run: ``python -m benchmarks.production_memory [--json PATH] [--only ID ...]`` (prints a
markdown table; ``make bench`` runs it). ``tests/datarax/test_production_memory.py``
compiles the same runs.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Mapping, Sequence  # noqa: E402
from typing import Any  # noqa: E402

_OFFLOAD_LAYER = dict.fromkeys(
    ("decoder_layer_input", "query_proj", "key_proj", "value_proj", "out_proj"), "offload"
)
_F32_WEIGHTS = {"param_dtype": "float32", "dtype": "bfloat16"}

RUNS: list[dict[str, Any]] = [
    {
        "id": "llama3.1-8b-v6e8-offload",
        "hardware": "tpu-v6e",
        "topology": "2x4",
        "ici": {"fsdp": 8},
        "global_batch": 24,
        "model": {
            "name": "llama3.1-8b",
            **_F32_WEIGHTS,
            "remat": "custom",
            "remat_custom": _OFFLOAD_LAYER,
        },  # fmt: skip
        "why": "MaxText's published v6e-8 run (tpu-recipes), 3 sequences per chip",
    },
    {
        "id": "llama3.1-8b-v6e8-none",
        "hardware": "tpu-v6e",
        "topology": "2x4",
        "ici": {"fsdp": 8},
        "global_batch": 24,
        "model": {"name": "llama3.1-8b", **_F32_WEIGHTS, "remat": "none"},
        "why": "the same run saving every activation: out of memory",
    },
    {
        "id": "mistral-7b-v6e8-offload",
        "hardware": "tpu-v6e",
        "topology": "2x4",
        "ici": {"fsdp": 8},
        "global_batch": 48,
        "model": {
            "name": "mistral-7b",
            **_F32_WEIGHTS,
            "remat": "custom",
            "remat_custom": _OFFLOAD_LAYER,
        },  # fmt: skip
        "why": "MaxText's published v6e-8 Mistral run, 6 sequences per chip",
    },
    {
        "id": "llama3.1-8b-v6e8-tp2-tiled",
        "hardware": "tpu-v6e",
        "topology": "2x4",
        "ici": {"fsdp": 4, "tensor": 2},
        "global_batch": 16,
        "model": {
            "name": "llama3.1-8b",
            **_F32_WEIGHTS,
            "remat": "save_qkv_proj",
            "vocab_tiling": 4,
        },  # fmt: skip
        "why": "fsdp x tensor with q/k/v kept and a tiled loss",
    },
    {
        "id": "llama2-7b-v5p8-full",
        "hardware": "tpu-v5p",
        "topology": "2x2x2",
        "ici": {"fsdp": 8},
        "global_batch": 32,
        "model": {"name": "llama2-7b", **_F32_WEIGHTS, "remat": "full"},
        "why": "4 sequences of 4096 per chip, full remat",
    },
    {
        "id": "llama2-7b-v5p8-minimal",
        "hardware": "tpu-v5p",
        "topology": "2x2x2",
        "ici": {"fsdp": 4, "tensor": 2},
        "global_batch": 16,
        "model": {"name": "llama2-7b", **_F32_WEIGHTS, "remat": "minimal"},
        "why": "minimal remat (every projection kept) with tensor 2",
    },
    {
        "id": "llama2-13b-v5p16-save-dot",
        "hardware": "tpu-v5p",
        "topology": "2x2x4",
        "ici": {"fsdp": 16},
        "global_batch": 32,
        "model": {"name": "llama2-13b", **_F32_WEIGHTS, "remat": "save_dot_except_mlp"},
        "why": "13B, 2 sequences per chip",
    },
    {
        "id": "llama2-7b-v5e16-full",
        "hardware": "tpu-v5e",
        "topology": "4x4",
        "ici": {"fsdp": 16},
        "global_batch": 16,
        "model": {"name": "llama2-7b", "remat": "full"},
        "why": "bf16 weights on 16 GiB chips, one sequence each",
    },
    {
        "id": "llama3.1-8b-v5e16-tiled",
        "hardware": "tpu-v5e",
        "topology": "4x4",
        "ici": {"fsdp": 16},
        "global_batch": 16,
        "model": {"name": "llama3.1-8b", "remat": "full", "vocab_tiling": 4},
        "why": "128k vocabulary on 16 GiB chips: the tiled loss",
    },
    {
        "id": "llama2-70b-v5p64-save-dot",
        "hardware": "tpu-v5p",
        "topology": "4x4x4",
        "ici": {"fsdp": 64},
        "global_batch": 128,
        "model": {"name": "llama2-70b", **_F32_WEIGHTS, "remat": "save_dot_except_mlpwi"},
        "why": "MaxText PR #2957's boundary: 2 sequences per chip fit on v5p-128",
    },
    {
        "id": "llama3.1-70b-v6e64-offload",
        "hardware": "tpu-v6e",
        "topology": "8x8",
        "ici": {"fsdp": 64},
        "global_batch": 64,
        "model": {
            "name": "llama3.1-70b",
            **_F32_WEIGHTS,
            "remat": "custom",
            "remat_custom": {
                "decoder_layer_input": "offload",
                "query_proj": "offload",
                "key_proj": "offload",
                "value_proj": "offload",
            },
        },  # fmt: skip
        "why": "70B on v6e-64 with host offload, one sequence per chip",
    },
    {
        "id": "gemma2-9b-v6e8-full",
        "hardware": "tpu-v6e",
        "topology": "2x4",
        "ici": {"fsdp": 8},
        "global_batch": 16,
        "model": {"name": "gemma2-9b", **_F32_WEIGHTS, "remat": "full", "vocab_tiling": 4},
        "why": "tied 256k vocabulary, head_dim 256",
    },
    {
        "id": "mixtral-8x7b-v6e64-capacity",
        "hardware": "tpu-v6e",
        "topology": "8x8",
        "ici": {"fsdp": 64},
        "global_batch": 64,
        "model": {
            "name": "mixtral-8x7b",
            **_F32_WEIGHTS,
            "seq_len": 4096,
            "remat": "full",
            "moe_kernel": "dense",
            "capacity_factor": 1.25,
        },  # fmt: skip
        "why": "mixture of experts, the capacity kernel of tpu-recipes' Mixtral run, fsdp only",
    },
    {
        "id": "mixtral-8x7b-v6e256-capacity-offload",
        "hardware": "tpu-v6e",
        "topology": "16x16",
        "ici": {"fsdp": 256},
        "global_batch": 12 * 256,
        "model": {
            "name": "mixtral-8x7b",
            **_F32_WEIGHTS,
            "seq_len": 4096,
            "remat": "custom",
            "remat_custom": _OFFLOAD_LAYER,
            "moe_kernel": "dense",
            "capacity_factor": 1.25,
        },  # fmt: skip
        "why": "tpu-recipes' published Mixtral 8x7B run as it ran (12 sequences a chip, "
        "layer inputs and projections offloaded): it ran, so it must be judged to fit",
    },
    {
        "id": "mixtral-8x7b-v5p64-expert4-capacity",
        "hardware": "tpu-v5p",
        "topology": "4x4x4",
        "ici": {"fsdp": 16, "expert": 4},
        "global_batch": 64,
        "model": {
            "name": "mixtral-8x7b",
            **_F32_WEIGHTS,
            "seq_len": 4096,
            "remat": "full",
            "moe_kernel": "dense",
            "capacity_factor": 1.25,
        },  # fmt: skip
        "why": "mixture of experts over an expert axis: the tokens dispatched by XLA's "
        "resharding of the capacity kernel's einsums",
    },
    {
        "id": "mixtral-8x7b-v5p64-expert4-dropless",
        "hardware": "tpu-v5p",
        "topology": "4x4x4",
        "ici": {"fsdp": 16, "expert": 4},
        "global_batch": 64,
        "model": {"name": "mixtral-8x7b", **_F32_WEIGHTS, "seq_len": 4096, "remat": "full"},
        "why": "the dropless kernel over an expert axis: all-to-all into worst-case buffers",
        "suite": False,  # a three-minute compile: make bench only
    },
    {
        "id": "mixtral-8x7b-v6e64-dropless",
        "hardware": "tpu-v6e",
        "topology": "8x8",
        "ici": {"fsdp": 64},
        "global_batch": 64,
        "model": {"name": "mixtral-8x7b", **_F32_WEIGHTS, "seq_len": 4096, "remat": "full"},
        "why": "the dropless kernel without an expert axis: every expert gathered a layer at "
        "a time",
    },
    {
        "id": "qwen3-30b-a3b-v5p16-expert8-dropless",
        "hardware": "tpu-v5p",
        "topology": "2x2x4",
        "ici": {"fsdp": 2, "expert": 8},
        "global_batch": 16,
        "model": {"name": "qwen3-30b-a3b", **_F32_WEIGHTS, "remat": "full"},
        "why": "128 experts, 8 a token, over 8 expert shards",
        "suite": False,  # a two-and-a-half-minute compile: make bench only
    },
    {
        "id": "llama3.1-70b-v5p64-128k-context4",
        "hardware": "tpu-v5p",
        "topology": "4x4x4",
        "ici": {"fsdp": 16, "context": 4},
        "global_batch": 16,
        "model": {"name": "llama3.1-70b", **_F32_WEIGHTS, "seq_len": 131072, "remat": "full"},
        "context_parallel": {"strategy": "all_gather", "load_balance": True},
        "why": "128k-token sequences split over a context axis: splash attention on each "
        "device's queries against keys and values gathered over it",
    },
    {
        "id": "deepseek3-671b-v5p1024-expert8",
        "hardware": "tpu-v5p",
        "topology": "8x8x8",
        "ici": {"fsdp": 64, "expert": 8},
        "global_batch": 512,
        "model": {"name": "deepseek3-671b", **_F32_WEIGHTS, "remat": "full"},
        "why": "MLA attention and 256 routed experts (8 a token) over 8 expert shards on 512 chips",
        "suite": False,  # minutes of compile: make bench only
    },
    {
        "id": "llama3.1-8b-v6e16-zero1",
        "hardware": "tpu-v6e",
        "topology": "4x4",
        "ici": {"data": 4, "fsdp": 4},
        "global_batch": 16,
        "model": {"name": "llama3.1-8b", **_F32_WEIGHTS, "remat": "full"},
        "shard_over_data": True,
        "why": "ZeRO-1: the optimizer state split over the data axis as well as fsdp",
    },
    {
        "id": "llama3.1-8b-v6e16-zero1-b32",
        "hardware": "tpu-v6e",
        "topology": "4x4",
        "ici": {"data": 4, "fsdp": 4},
        "global_batch": 32,
        "model": {"name": "llama3.1-8b", **_F32_WEIGHTS, "remat": "full"},
        "shard_over_data": True,
        "why": "the same with two sequences a chip: XLA fits it in 28.4 of 31.2 GiB, the "
        "estimate (31.5) does not",
        "suite": False,  # its fits verdict disagrees with XLA's (BENCHMARKS.md): bench only
    },
    {
        "id": "llama3.1-8b-v6e16-data4-fsdp4",
        "hardware": "tpu-v6e",
        "topology": "4x4",
        "ici": {"data": 4, "fsdp": 4},
        "global_batch": 32,
        "model": {"name": "llama3.1-8b", **_F32_WEIGHTS, "remat": "full"},
        "why": "the ZeRO-1 run's mesh without ZeRO-1: the whole optimizer state on each data shard",
        "suite": False,  # the ZeRO-1 run's baseline: make bench only
    },
    {
        "id": "llama3.1-70b-v5p64-stage4-gpipe",
        "hardware": "tpu-v5p",
        "topology": "4x4x4",
        "ici": {"stage": 4, "fsdp": 16},
        "global_batch": 64,
        "model": {"name": "llama3.1-70b", **_F32_WEIGHTS, "seq_len": 8192, "remat": "full"},
        "pipeline": {"microbatches": 4, "schedule": "gpipe"},
        "why": "80 layers as 4 pipeline stages of 20, 4 microbatches (GPipe)",
    },
    {
        "id": "llama3.1-70b-v5p64-stage4-circular",
        "hardware": "tpu-v5p",
        "topology": "4x4x4",
        "ici": {"stage": 4, "fsdp": 16},
        "global_batch": 64,
        "model": {"name": "llama3.1-70b", **_F32_WEIGHTS, "seq_len": 8192, "remat": "full"},
        "pipeline": {"microbatches": 4, "layers_per_stage": 5, "schedule": "circular"},
        "why": "the same stages run circular: 4 passes of 5 layers a stage",
        "suite": False,  # make bench only
    },
]
"""Production-shaped runs: the model, the mesh and why each is here. Runs marked
``"suite": False`` compile for minutes; ``make bench`` compiles them, the test suite
(``tests/datarax/test_production_memory.py``) does not."""

SUITE_RUNS: list[dict[str, Any]] = [run for run in RUNS if run.get("suite", True)]
"""The runs the test suite compiles."""


def compile_run(run: Mapping[str, Any]) -> dict[str, Any]:
    """XLA's figures for the run (``compile_step.compile_train_step`` on libtpu's
    topology, in the plan's device order)."""
    from datarax.hardware.chips import get_hardware  # noqa: PLC0415
    from datarax.hardware.topology import plan_hardware_devices  # noqa: PLC0415
    from datarax.spmd.compile_step import (  # noqa: PLC0415
        compile_train_step,
        mesh_from_ids,
        tpu_topology_devices,
    )

    hw = get_hardware(run["hardware"])
    layout = plan_hardware_devices(hw, ici=run["ici"], topology=run["topology"])
    devices = tpu_topology_devices(hw.name, run["topology"])
    mesh = mesh_from_ids(devices, layout.device_grid, list(layout.axes))
    start = time.perf_counter()
    out = compile_train_step(
        run["model"],
        mesh,
        run["global_batch"],
        hbm_bytes=hw.hbm_bytes,
        context=run.get("context_parallel"),
        shard_over_data=bool(run.get("shard_over_data")),
        pipeline=run.get("pipeline"),
    )
    out["wall_s"] = time.perf_counter() - start
    return out


def estimate(run: Mapping[str, Any]) -> dict[str, Any]:
    from datarax.estimate.memory import hardware_memory, memory_estimate  # noqa: PLC0415
    from datarax.hardware.chips import get_hardware  # noqa: PLC0415
    from datarax.parallel.options import ParallelOptions  # noqa: PLC0415

    hw = get_hardware(run["hardware"])
    options = ParallelOptions.from_json(
        pipeline=run.get("pipeline"),
        context_parallel=run.get("context_parallel"),
        shard_over_data=bool(run.get("shard_over_data")),
    )
    return memory_estimate(
        run["model"], run["ici"], run["global_batch"], options=options, **hardware_memory(hw)
    )


def compare(run: Mapping[str, Any], xla: Mapping[str, Any]) -> dict[str, Any]:
    """The estimate beside XLA's figure: ``error`` relative to XLA's HBM allocation (None
    when XLA refused the program), and whether the two ``fits`` agree."""
    est = estimate(run)
    hbm = (xla.get("memory") or {}).get("hbm_peak_bytes")
    host = (xla.get("memory") or {}).get("host_temp_bytes")
    return {
        "id": run["id"],
        "xla_fits": xla["fits"],
        "estimate_fits": est["fits"],
        "xla_hbm_bytes": hbm,
        "estimate_bytes": est["total"],
        "error": None if not hbm else (est["total"] - hbm) / hbm,
        "xla_host_bytes": host,
        "estimate_host_bytes": est["host_offload_bytes"],
        "compile_s": xla.get("compile_s"),
        "xla_error": (xla.get("xla_error") or "")[:300] or None,
    }


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    gib = 2**30
    lines = [
        "| run | XLA HBM GiB | estimate GiB | error | XLA host GiB | estimate host GiB | "
        "fits (XLA / estimate) | compile s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        xla = "OOM" if r["xla_hbm_bytes"] is None else f"{r['xla_hbm_bytes'] / gib:.2f}"
        err = "-" if r["error"] is None else f"{r['error']:+.1%}"
        host = "-" if not r["xla_host_bytes"] else f"{r['xla_host_bytes'] / gib:.2f}"
        lines.append(
            f"| {r['id']} | {xla} | {r['estimate_bytes'] / gib:.2f} | {err} | {host} | "
            f"{r['estimate_host_bytes'] / gib:.2f} | {r['xla_fits']} / {r['estimate_fits']} | "
            f"{r['compile_s'] or 0:.1f} |"
        )
    measured = [r for r in rows if r["error"] is not None]
    within = [r for r in measured if abs(r["error"]) <= 0.10]
    agree = [r for r in rows if r["xla_fits"] == r["estimate_fits"]]
    lines += [
        "",
        f"Within 10% of XLA's HBM allocation: {len(within)} of {len(measured)} compiled runs; "
        f"fits agree in {len(agree)} of {len(rows)}.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the XLA figures and the comparison here")
    parser.add_argument("--only", nargs="*", help="run ids")
    parser.add_argument("--from-json", help="compare XLA figures written by --json before")
    args = parser.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            xla_by_id = {row["id"]: row["xla"] for row in json.load(f)}
    else:
        xla_by_id = {}
        for run in RUNS:
            if args.only and run["id"] not in args.only:
                continue
            xla_by_id[run["id"]] = compile_run(run)
            print(run["id"], xla_by_id[run["id"]]["fits"], xla_by_id[run["id"]]["wall_s"],
                  file=sys.stderr, flush=True)  # fmt: skip
    rows = [compare(run, xla_by_id[run["id"]]) for run in RUNS if run["id"] in xla_by_id]
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"id": i, "xla": x} for i, x in xla_by_id.items()], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
