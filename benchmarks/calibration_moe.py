"""The mixture-of-experts constants of the step-time model, fitted on the published runs
issue 38 names, and nothing else.

The constants (:class:`datarax.estimate.step_time.Calibration`): ``grouped_matmul``, the
fraction of peak the routed experts' grouped matmuls reach (the ``sparse`` kernel), and
``all_to_all_overlap``, the share of the experts' all-to-all that hides behind compute.
The dense constants (matmul, attention, HBM, overlap) stay those that
``benchmarks/calibrate.py`` fits on the dense runs; they are not refitted here, so the
dense runs are predicted exactly as before.

The runs, each with the commit its figures were read at:

* AI-Hypercomputer/tpu-recipes at ``c8cfe2f689081d36701a101cd73a70965d80926b``:
  ``training/trillium/Mixtral-8x7B-MaxText/README.md`` (its logged step, 13.484 s, and its
  ``mixtral_8x7b_dropped`` tuning params: v6e-256, fsdp 256, per-device batch 12 x 4096,
  the dense kernel with capacity 1.25, MaxText tag tpu-recipes-v0.1.2) and
  ``training/v5p/Llama4-Maverick-17B-128E-Maxtext/README.md`` (24.792 s; v5p-256, fsdp 32 x
  tensor 4, per-device batch 4 x 8192, megablox, weights float32, tag tpu-recipes-v0.1.3).
  Both offload the layer input and the q/k/v/out projections (``remat_policy: custom``).
* AI-Hypercomputer/maxtext ``docs/guides/optimization/custom_model.md`` at
  ``e591f30cbbf217ed67ef71263ec0538239f9c3b8``: the 700B Mixtral-like model's final
  config, 38.1% MFU on one v6e-256 pod and 35.3% on four; its tuning params
  (``custom_moe_700b``, per-device batch 1 x 8192, fsdp 16 x expert 16, capacity 1.5,
  weights bfloat16, SGD) from ``benchmarks/maxtext_trillium_model_configs.py`` at
  ``3662540ee852d0d8f8333a36c04ddc0f1316ebfb``. The step is derived from the MFU with
  MaxText's own FLOP count at that commit (``calculate_tflops_training_per_device``:
  the gate, ``num_experts_per_tok`` experts' gated MLP, q/k/v/out projections, the
  embedding, times three; attention ``4 B S^2 H hd`` times three, not causal) over
  v6e's 918 TFLOP/s. The page's initial and experimental configs and its 10T model
  publish no mesh or batch, so they are not used.
* AI-Hypercomputer/gpu-recipes at ``2e1fd5e``: ``training/a3ultra/mixtral_8x7b/
  nemo-gke/nemo2407/recipe/README.md``'s logged ``train_step_timing`` (2.7396 s) with
  ``src/frameworks/a3ultra/nemo-configs/mixtral-8x7b-256gpus-a3u-bf16.yaml`` (commit
  ``78012f9332adf08c40ed1f1c8a830fd9a1327cda``): NeMo (PyTorch) on 256 H200, global batch
  1024 x 4096, expert parallel 8 (within a host) and data parallel 32, no activation
  recompute, the distributed optimizer (ZeRO-1), per-expert GEMMs padded to capacity 1.0.

Which constant each run informs: every run's routed experts run as matmuls batched over
the experts (the sparse kernel's grouped matmuls; the dense kernel's capacity-padded
einsums, whose dispatch and combine masks stay plain matmuls), so every run informs
``grouped_matmul`` of its kind; the runs with an expert axis (the 700B, the GPU runs)
inform ``all_to_all_overlap``. The four-pod 700B run is held out of the fit.

Run: ``python -m benchmarks.calibration_moe`` (markdown). ``make bench`` writes its table
into BENCHMARKS.md.
"""

# ruff: noqa: E501  (data file: long source URLs and notes)
from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from datarax.estimate.cost import estimate_step  # noqa: E402
from datarax.estimate.step_time import PUBLISHED_CONSTANTS, Calibration, combine  # noqa: E402
from datarax.hardware.chips import get_hardware  # noqa: E402
from datarax.hardware.topology import plan_hardware_devices  # noqa: E402
from datarax.parallel.options import ParallelOptions  # noqa: E402

GROUPED = [x / 100 for x in range(30, 101)]
A2A_OVERLAP = [x / 10 for x in range(0, 11)]

_TR = "https://github.com/AI-Hypercomputer/tpu-recipes/blob/c8cfe2f689081d36701a101cd73a70965d80926b/training/"
_MT_DOC = "https://github.com/AI-Hypercomputer/maxtext/blob/e591f30cbbf217ed67ef71263ec0538239f9c3b8/docs/guides/optimization/custom_model.md"
_GRM = (
    "https://github.com/AI-Hypercomputer/gpu-recipes/blob/dc6ef1afc1492f05e5741356f00cf645a9f1b795/"
    "training/a3ultra/mixtral-8x7b/maxtext-pretraining-gke/README.md"
)
_GR = "https://github.com/AI-Hypercomputer/gpu-recipes/blob/2e1fd5e/training/a3ultra/mixtral_8x7b/nemo-gke/nemo2407/recipe/README.md"
_OFFLOAD = dict.fromkeys(
    ("decoder_layer_input", "out_proj", "query_proj", "key_proj", "value_proj"), "offload"
)

_V6E_PEAK = 918e12  # v6e bf16 peak, the catalog's (Google Cloud's Trillium page)


def _maxtext_tflops_700b() -> float:
    """MaxText's ``calculate_tflops_training_per_device`` (commit 3662540) for
    ``custom_moe_700b``: per device, per step, in FLOPs."""
    b, s, d, mlp, e, k, h, kv, hd, layers, vocab = (
        1,
        8192,
        8192,
        32768,
        16,
        2,
        128,
        8,
        256,
        56,
        32000,
    )
    gate = 2 * b * s * d * e
    ffn = gate + (2 * b * s * mlp * d * 2 + 2 * b * s * mlp * d) * k
    qkv = 2 * b * s * d * (h + 2 * kv) * hd
    proj = 2 * b * s * d * h * hd
    attention = 4 * b * s * s * h * hd
    embedding = 2 * b * s * d * vocab
    return ((ffn + qkv + proj) * layers + embedding) * 3 + attention * layers * 3


_MOE_700B = {
    "kind": "transformer", "layers": 56, "d_model": 8192, "d_ff": 32768, "heads": 128,
    "kv_heads": 8, "head_dim": 256, "vocab": 32000, "seq_len": 8192, "num_experts": 16,
    "experts_per_token": 2, "moe_kernel": "dense", "capacity_factor": 1.5,
    "remat": "custom", "remat_custom": _OFFLOAD, "param_dtype": "bfloat16",
}  # fmt: skip

MOE_RUNS: list[dict[str, Any]] = [
    {
        "id": "tpu-recipes-mixtral-8x7b-v6e-256",
        "hardware": "tpu-v6e", "topology": "16x16", "slices": 1,
        "ici": {"fsdp": 256}, "dcn": {},
        "global_batch": 12 * 256, "optimizer": "adamw",
        "model": {"name": "mixtral-8x7b", "seq_len": 4096, "remat": "custom",
                  "remat_custom": _OFFLOAD, "param_dtype": "float32", "moe_kernel": "dense",
                  "capacity_factor": 1.25},
        "measured_s": 13.484, "held_out": False,
        "source": _TR + "trillium/Mixtral-8x7B-MaxText/README.md",
    },
    {
        "id": "tpu-recipes-llama4-maverick-v5p-256",
        "hardware": "tpu-v5p", "topology": "4x4x8", "slices": 1,
        "ici": {"fsdp": 32, "tensor": 4}, "dcn": {},
        "global_batch": 4 * 128, "optimizer": "adamw",
        "model": {"name": "llama4-17b-128e", "seq_len": 8192, "remat": "custom",
                  "remat_custom": _OFFLOAD, "param_dtype": "float32"},
        "measured_s": 24.792, "held_out": False,
        "source": _TR + "v5p/Llama4-Maverick-17B-128E-Maxtext/README.md",
    },
    {
        "id": "maxtext-custom-moe-700b-v6e-256",
        "hardware": "tpu-v6e", "topology": "16x16", "slices": 1,
        "ici": {"data": 1, "fsdp": 16, "expert": 16}, "dcn": {"data": 1, "fsdp": 1, "expert": 1},
        "global_batch": 256, "optimizer": "sgd", "model": _MOE_700B,
        "measured_s": _maxtext_tflops_700b() / (0.381 * _V6E_PEAK), "held_out": False,
        "source": _MT_DOC + " (38.1% MFU, one pod; step derived from MaxText's FLOP count)",
    },
    {
        "id": "maxtext-custom-moe-700b-4x-v6e-256",
        "hardware": "tpu-v6e", "topology": "16x16", "slices": 4,
        "ici": {"data": 1, "fsdp": 16, "expert": 16}, "dcn": {"data": 4, "fsdp": 1, "expert": 1},
        "global_batch": 1024, "optimizer": "sgd", "model": _MOE_700B,
        "measured_s": _maxtext_tflops_700b() / (0.353 * _V6E_PEAK), "held_out": True,
        "source": _MT_DOC + " (35.3% MFU, four pods; step derived from MaxText's FLOP count)",
    },
    {
        "id": "gpu-recipes-nemo-mixtral-8x7b-256-h200",
        "hardware": "h200-sxm", "hosts": 32,
        "ici": {"data": 1, "expert": 8}, "dcn": {"data": 32, "expert": 1},
        "global_batch": 1024, "optimizer": "adamw", "shard_over_data": True,
        "framework": "pytorch",
        "model": {"name": "mixtral-8x7b", "seq_len": 4096, "remat": "none",
                  "param_dtype": "bfloat16", "capacity_factor": 1.0},
        "measured_s": 2.7396187782287598, "held_out": False,
        "source": _GR + " (train_step_timing; NeMo, PyTorch)",
        "notes": "NeMo accumulates 2 micro-batches of 2 sequences; the spec prices the "
        "4 sequences of a GPU as one batch, so its memory is about twice the run's",
    },
    {
        "id": "gpu-recipes-maxtext-mixtral-8x7b-256-h200",
        "hardware": "h200-sxm", "hosts": 32,
        "ici": {"data": 1, "fsdp": 1, "expert": 8}, "dcn": {"data": 16, "fsdp": 2, "expert": 1},
        "global_batch": 5 * 256, "optimizer": "adamw",
        "model": {"name": "mixtral-8x7b", "seq_len": 4096, "remat": "minimal",
                  "param_dtype": "bfloat16", "moe_kernel": "dense", "capacity_factor": 1.0},
        "measured_s": 3.437, "held_out": False,
        "source": _GRM + " (its log line, step 45; MaxText on A3 Ultra)",
        "notes": "issue 39's source for published-gpu-jax: MaxText's dense (capacity) "
        "kernel, expert parallelism 8 within a node, remat custom keeping q/k/v/out and "
        "the MLP projections (MaxText's minimal)",
    },
]  # fmt: skip
"""The published MoE runs issue 38 names (and, for the JAX GPU profile, the one of the
gpu-recipes MaxText runs issue 39 names), as plan requests take them."""


def components(run: Mapping[str, Any]) -> dict[str, Any]:
    """The run's uncalibrated step parts (and the estimate's memory verdict)."""
    hw = get_hardware(run["hardware"])
    layout = plan_hardware_devices(
        hw,
        ici=run["ici"],
        dcn=run["dcn"],
        topology=run.get("topology"),
        slices=int(run.get("slices") or 1),
        hosts=run.get("hosts"),
    )
    est = estimate_step(
        hw,
        layout.axes_detail,
        run["model"],
        int(run["global_batch"]),
        optimizer=run["optimizer"],
        options=ParallelOptions(shard_over_data=bool(run.get("shard_over_data"))),
    )
    memory = est.memory_per_device
    return {
        "kind": hw.kind,
        "profile": f"published-{hw.kind}-{run.get('framework', 'jax')}",
        "parts": est.predicted_components,
        "fits": memory.fits,
        "total_gib": memory.total / 2**30,
    }


def _mae(rows: Sequence[Mapping[str, Any]], cal: Calibration) -> float:
    errors = [abs(combine(r["parts"], cal).step_s / r["measured"] - 1) for r in rows]
    return sum(errors) / len(errors) if errors else float("nan")


def fit(rows: Sequence[Mapping[str, Any]], base: Calibration) -> tuple[Calibration, list[str]]:
    """``(constants, notes)``: ``grouped_matmul`` first, the grid value with the least
    mean absolute relative error on the rows with routed experts (either kernel), then ``all_to_all_overlap``
    on all of ``rows`` with that ``grouped_matmul``; the dense constants of ``base``
    kept. A constant is adopted only where the rows say something of it: a
    ``grouped_matmul`` at the grid's edge (0.30 or 1.00) means the runs miss by more
    than the experts' matmuls can explain, and an ``all_to_all_overlap`` that does not cut
    the error by a point leaves the all-to-all under the dense ``overlap``; both then
    stay ``None`` (the parts priced as before), and ``notes`` says why."""
    notes: list[str] = []
    cal = base
    experts = [r for r in rows if r["parts"].get("gmm_fwd", 0.0) > 0]
    if experts:
        best = min(GROUPED, key=lambda g: _mae(experts, replace(cal, grouped_matmul=g)))
        if best in (GROUPED[0], GROUPED[-1]):
            notes.append(
                f"grouped_matmul's best fit is {best:.2f}, the grid's edge: the MoE runs "
                f"miss by more than the experts' matmul efficiency explains; not adopted"
            )
        else:
            cal = replace(cal, grouped_matmul=best)
    if any(r["parts"].get("a2a_fwd", 0.0) > 0 for r in rows):
        best_o = min(A2A_OVERLAP, key=lambda o: _mae(rows, replace(cal, all_to_all_overlap=o)))
        gain = _mae(rows, cal) - _mae(rows, replace(cal, all_to_all_overlap=best_o))
        if gain > 0.01:
            cal = replace(cal, all_to_all_overlap=best_o)
        else:
            notes.append(
                f"all_to_all_overlap {best_o:.1f} would cut the error by {gain:.1%}: not adopted"
            )
    return cal, notes


def study() -> dict[str, Any]:
    """Rows, the fitted constants per calibration profile and the errors (training and
    held out)."""
    rows = [{"run": run, "measured": run["measured_s"], **components(run)} for run in MOE_RUNS]
    fitted, notes = {}, {}
    for profile in sorted({r["profile"] for r in rows}):
        train = [r for r in rows if r["profile"] == profile and not r["run"]["held_out"]]
        base = replace(PUBLISHED_CONSTANTS[profile], grouped_matmul=None, all_to_all_overlap=None)
        fitted[profile], notes[profile] = fit(train, base)
    for row in rows:
        row["predicted"] = combine(row["parts"], fitted[row["profile"]]).step_s
        row["shipped"] = combine(row["parts"], PUBLISHED_CONSTANTS[row["profile"]]).step_s
        row["error"] = row["predicted"] / row["measured"] - 1
    return {"rows": rows, "fitted": fitted, "notes": notes}


def markdown(result: Mapping[str, Any]) -> str:
    lines = [
        "| run | hardware | mesh (ici / dcn) | batch | measured s | predicted s | error | "
        "fits | set | source |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        run = r["run"]
        lines.append(
            f"| {run['id']} | {run['hardware']} | {run['ici']} / {run['dcn']} | "
            f"{run['global_batch']} | {r['measured']:.3f} | {r['predicted']:.3f} | "
            f"{r['error']:+.1%} | {r['fits']} | "
            f"{'held out' if run['held_out'] else 'fit'} | {run['source']} |"
        )
    lines.append("")
    for profile, cal in result["fitted"].items():
        lines.append(
            f"- {profile}: grouped_matmul {cal.grouped_matmul}, all_to_all_overlap "
            f"{cal.all_to_all_overlap} (the dense constants as benchmarks/calibrate.py fits them)"
            + "".join(f"; {note}" for note in result["notes"][profile])
        )
    train = [r for r in result["rows"] if not r["run"]["held_out"]]
    held = [r for r in result["rows"] if r["run"]["held_out"]]
    for name, selected in (("training", train), ("held-out", held)):
        errors = [abs(r["error"]) for r in selected]
        lines.append(
            f"- {name} rows: mean absolute error {sum(errors) / len(errors):.1%} over {len(errors)}"
        )
    for r in result["rows"]:
        if r["run"].get("notes"):
            lines.append(f"- {r['run']['id']}: {r['run']['notes']}")
    return "\n".join(lines)


def main() -> int:
    print(markdown(study()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
