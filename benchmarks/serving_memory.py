"""The decode step's XLA memory against the serving estimate (issue 57, item 5).

For each configuration: the serving estimate's ``memory_per_device`` (``weights`` and
``kv_cache``, :func:`datarax.estimate.serving_memory.serving_capacity`, what a serving
plan answers) and one KV-cached decode step of the library's transformer
(:func:`datarax.spmd.compile_decode.compile_decode_step`) compiled ahead of time through
libtpu for the plan's TPU topology (``JAX_PLATFORMS=cpu``, no TPU attached), one compile
at a time. The decode step holds ``batch`` sequences a replica of ``input_tokens +
output_tokens`` positions, the batch the estimate prices.

What is compared: XLA's ``argument_size_in_bytes`` per device (the step's weights, its
donated cache, the tokens) against the estimate's ``weights + kv_cache``; ``error`` is
``(estimate - XLA) / XLA``. XLA's ``temp`` (the step's transients) and its HBM peak
are shown beside, and so are the weights and cache bytes of the arguments' own
shardings, to say which term an error comes from.

Run: ``python -m benchmarks.serving_memory [--json PATH] [--only ID ...]`` (prints the
markdown table). Needs libtpu (installed with the ``tpu`` extra).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

_MLA_SMALL = {
    "kind": "transformer", "layers": 16, "d_model": 2048, "d_ff": 8192, "heads": 16,
    "kv_heads": 16, "vocab": 102400, "seq_len": 4096, "attention_type": "mla",
    "q_lora_rank": 0, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128,
}  # fmt: skip
"""A dense MLA model (DeepSeek-V2-Lite's attention on 16 dense layers)."""

_MLA_MOE = {
    **_MLA_SMALL, "layers": 27, "d_ff": 10944, "num_experts": 64, "experts_per_token": 6,
    "moe_d_ff": 1408, "shared_experts": 2, "first_dense_layers": 1,
}  # fmt: skip
"""DeepSeek-V2-Lite's figures (15.7B parameters: MLA, 64 routed experts, 2 shared)."""

CONFIGS: list[dict[str, Any]] = [
    {"id": "dense-small", "hardware": "tpu-v5e", "topology": "2x2", "axes": {"tensor": 4},
     "model": {"name": "llama3.1-8b"}, "input_tokens": 1024, "output_tokens": 1024,
     "max_batch": 32},
    {"id": "dense-medium", "hardware": "tpu-v6e", "topology": "2x4", "axes": {"tensor": 8},
     "model": {"name": "llama3.1-70b"}, "input_tokens": 2048, "output_tokens": 1024,
     "max_batch": 32},
    {"id": "moe-small", "hardware": "tpu-v6e", "topology": "2x2", "axes": {"tensor": 4},
     "model": {"name": "qwen3-30b-a3b"},
     "input_tokens": 1024, "output_tokens": 512, "max_batch": 32},
    {"id": "moe-medium", "hardware": "tpu-v5e", "topology": "2x4", "axes": {"tensor": 8},
     "model": {"name": "mixtral-8x7b"}, "input_tokens": 1024, "output_tokens": 1024,
     "max_batch": 16},
    {"id": "mla-small", "hardware": "tpu-v5e", "topology": "2x2",
     "axes": {"data": 2, "tensor": 2}, "model": _MLA_SMALL, "input_tokens": 2048,
     "output_tokens": 2048, "max_batch": 16},
    {"id": "mla-moe-medium", "hardware": "tpu-v6e", "topology": "2x2", "axes": {"tensor": 4},
     "model": _MLA_MOE, "input_tokens": 4096, "output_tokens": 1024, "max_batch": 32},
]  # fmt: skip


def run_one(config: dict[str, Any]) -> dict[str, Any]:
    """One configuration's estimate and compile."""
    import numpy as np  # noqa: PLC0415 - after the environment above
    from jax.sharding import Mesh  # noqa: PLC0415

    from datarax.estimate.serving_memory import (  # noqa: PLC0415
        ServingOptions,
        serving_capacity,
        serving_layout,
    )
    from datarax.hardware.chips import get_hardware  # noqa: PLC0415
    from datarax.specs.model_specs import TransformerSpec, model_spec  # noqa: PLC0415
    from datarax.spmd.compile_decode import compile_decode_step  # noqa: PLC0415
    from datarax.spmd.compile_step import tpu_topology_devices  # noqa: PLC0415

    spec = model_spec(config["model"])
    assert isinstance(spec, TransformerSpec)
    hw = get_hardware(config["hardware"])
    axes = config["axes"]
    roles = {a: a for a in axes}
    options = ServingOptions(
        input_tokens=config["input_tokens"], output_tokens=config["output_tokens"],
        max_batch=config["max_batch"],
    )  # fmt: skip
    capacity = serving_capacity(spec, hw, serving_layout(spec, axes, roles), options)
    memory = capacity.memory
    devices = tpu_topology_devices(config["hardware"], config["topology"])
    mesh = Mesh(np.array(devices).reshape(*axes.values()), tuple(axes))
    xla = compile_decode_step(
        spec, mesh, roles, capacity.batch, options.sequence_tokens, hbm_bytes=hw.hbm_bytes
    )
    estimate = memory.weights + memory.kv_cache
    argument = xla.memory["argument_bytes"]
    return {
        "id": config["id"],
        "hardware": config["hardware"],
        "topology": config["topology"],
        "axes": axes,
        "model": config["model"].get("name", config["id"]),
        "batch": capacity.batch,
        "max_len": options.sequence_tokens,
        "estimate_weights": memory.weights,
        "estimate_kv_cache": memory.kv_cache,
        "estimate_bytes": estimate,
        "xla_argument_bytes": argument,
        "xla_weights_bytes": xla.weights_bytes,
        "xla_cache_bytes": xla.cache_bytes,
        "xla_temp_bytes": xla.memory["temp_bytes"],
        "xla_hbm_peak_bytes": xla.memory["hbm_peak_bytes"],
        "error": (estimate - argument) / argument,
        "compile_s": xla.figures["compile_s"],
    }


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table of BENCHMARKS.md's section "Decode step memory against the serving
    estimate"."""
    lines = [
        "| config | hardware | axes | model | batch x len | estimate weights + KV (GiB) | "
        "XLA arguments (GiB) | weights / cache, unpadded (GiB) | XLA temp (GiB) | error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        axes = " x ".join(f"{a} {n}" for a, n in r["axes"].items())
        lines.append(
            f"| {r['id']} | {r['hardware']} {r['topology']} | {axes} | {r['model']} | "
            f"{r['batch']} x {r['max_len']} | {_gib(r['estimate_weights'])} + "
            f"{_gib(r['estimate_kv_cache'])} = {_gib(r['estimate_bytes'])} | "
            f"{_gib(r['xla_argument_bytes'])} | {_gib(r['xla_weights_bytes'])} / "
            f"{_gib(r['xla_cache_bytes'])} | {_gib(r['xla_temp_bytes'])} | "
            f"{r['error'] * 100:+.1f}% |"
        )
    worst = max(abs(r["error"]) for r in rows) if rows else 0.0
    lines.append("")
    lines.append(f"Largest error {worst * 100:.1f}% over {len(rows)} configurations "
                 f"(target: within 10%).")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the rows as JSON here")
    parser.add_argument("--only", nargs="*", help="configuration ids")
    args = parser.parse_args(argv)
    rows = []
    for config in CONFIGS:
        if args.only and config["id"] not in args.only:
            continue
        start = time.perf_counter()
        row = run_one(config)
        print(f"{row['id']}: error {row['error'] * 100:+.1f}% "
              f"({time.perf_counter() - start:.0f} s)", file=sys.stderr)  # fmt: skip
        rows.append(row)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=2)
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
