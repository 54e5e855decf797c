"""Step times that predict measured wall time: a roofline with achieved fractions of peak,
memory-bound work, exposed communication and host-offload transfers, calibrated on
published measured training runs.

The roofline (``roofline_s``, what :mod:`datarax.estimate.cost` has always answered)
prices the model FLOPs at 100% of the chip's peak and hides every collective behind
compute. Measured steps are slower: matmuls reach a fraction of peak, fused attention
kernels a smaller one, norms, elementwise ops and the optimizer update are bound by HBM
bandwidth, collectives overlap compute only in part, remat recomputes part of the
forward pass and offloaded activations cross the host link. :func:`predict_step` prices
each of these (the model is written out in its docstring); :data:`CALIBRATION` holds the
fitted constants per accelerator kind, fitted on the runs of
``benchmarks/calibration_runs.py`` by ``benchmarks/calibrate.py`` (BENCHMARKS.md has the
table, the fit and the held-out error).

Example:
  >>> from datarax.specs.model_specs import model_spec
  >>> from datarax.hardware.chips import get_hardware
  >>> spec = model_spec({"name": "llama2-7b", "remat": "full"})
  >>> out = predict_step(spec, get_hardware("tpu-v5p"), {"data": 1, "fsdp": 64, "tensor": 1},
  ...                    tokens=4 * 4096, param_bytes=0, collectives=[], host_offload_bytes=0)
  >>> out["step_s"] > out["roofline_s"]
  True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from datarax.answers.calibrations import CalibrationConstants
from datarax.answers.estimates import RooflinePhase, RooflinePhases, StepBreakdown
from datarax.estimate.results import StepPrediction
from datarax.hardware.chips import Hardware
from datarax.parallel.context import MeshContext
from datarax.specs.flops import attention_forward_flops, recompute_flops_per_token
from datarax.specs.model_specs import DTYPE_BYTES, ModelSpec, TransformerSpec

__all__ = [
    "CALIBRATION",
    "PUBLISHED_CONSTANTS",
    "Calibration",
    "combine",
    "model_flops_per_token",
    "predict_step",
    "recompute_flops_per_token",
    "step_components",
]


Calibration = CalibrationConstants
"""Achieved fractions of peak and the overlap model of one accelerator kind: the
constants of a calibration profile (:class:`datarax.answers.calibrations.
CalibrationConstants`, one definition with the service's answer; its fields say what
each constant is)."""


_FIT = "fitted by benchmarks/calibrate.py on the training rows of benchmarks/calibration_runs.py"
PUBLISHED_CONSTANTS: dict[str, Calibration] = {
    "published-tpu-jax": Calibration(
        0.76, 0.65, 0.9, 0.4, 0.0, _FIT + " (MaxText on TPU)", grouped_matmul=0.57
    ),
    "published-gpu-pytorch": Calibration(
        0.45, 0.30, 0.9, 0.6, 0.0, _FIT + " (torchtitan, Megatron-LM)", grouped_matmul=0.54
    ),
    "published-gpu-jax": Calibration(
        0.71,
        0.30,
        0.7,
        0.1,
        0.0,
        _FIT + " (MaxText on H100 and H200: JAX-Toolbox, gpu-recipes)",
        grouped_matmul=0.73,
    ),
    "published-cpu-jax": Calibration(1.0, 1.0, 1.0, 1.0, 0.0, "nominal: simulated devices"),
}
PUBLISHED_ERRORS: dict[str, dict[str, float | int | None]] = {
    "published-tpu-jax": {
        "training_mae": 0.064, "training_runs": 42, "held_out_mae": 0.063, "held_out_runs": 19,
    },
    "published-gpu-jax": {
        "training_mae": 0.001, "training_runs": 2, "held_out_mae": 0.06, "held_out_runs": 6,
    },
    "published-gpu-pytorch": {
        "training_mae": 0.107, "training_runs": 7, "held_out_mae": 0.13, "held_out_runs": 2,
    },
}  # fmt: skip
"""How each fitted profile's constants fit its rows: mean absolute relative error of the
training rows and of the held-out ones (``benchmarks.calibrate.profile_errors``). The JAX
GPU profile rests on two training rows, the only bf16 runs issue 39's sources publish
(JAX-Toolbox's one MaxText row, gpu-recipes' A3 Ultra Llama 3.1 70B); its held-out rows are
gpu-recipes' A3 Mega Llama 2 7B, a source the fit may not use, and MaxText's A3 High Llama 2
7B on 1 to 16 nodes, which issue 39 names as held out."""
"""The shipped constants by calibration profile, ``published-<kind>-<framework>`` (see
:class:`Calibration` and :mod:`datarax.estimate.calibrations`): each fitted on the
training rows of its kind and software stack. The mixture-of-experts constants
(``grouped_matmul``, ``all_to_all_overlap``) are fitted by
``benchmarks/calibration_moe.py`` on the published MoE runs issue 38 names:
``grouped_matmul`` prices the routed experts' matmuls of both kernels (the sparse one's
grouped matmuls and the dense one's capacity-padded einsums batched over the experts);
``all_to_all_overlap`` stays unset everywhere (its own value does not cut the error by a
point, so ``overlap`` hides the all-to-all behind the work independent of it,
:func:`a2a_independent`). PyTorch GPU's
``grouped_matmul`` rests on one run (NeMo's Mixtral 8x7B on 256 H200), JAX GPU's on one
(MaxText's Mixtral 8x7B on 256 H200)."""

CALIBRATION: dict[str, Calibration] = {
    kind: PUBLISHED_CONSTANTS[f"published-{kind}-jax"]
    for kind in ("tpu", "gpu", "cpu")
    if f"published-{kind}-jax" in PUBLISHED_CONSTANTS
}
"""The default constants per ``Hardware.kind``: its ``jax`` profile's."""


_UPDATE_PASSES = {"adam": 7, "adamw": 7, "sgd": 3}
"""Passes over this device's parameter bytes of the optimizer update: Adam reads the
gradient and reads and writes the parameter and both moments; SGD the gradient and the
parameter."""


def model_flops_per_token(model: ModelSpec) -> float:
    """Model FLOPs of one training step per token, as MaxText's
    ``calculate_tflops_training_per_device`` counts them (``src/maxtext/utils/
    maxtext_utils.py``): ``6 N`` for the ``N`` parameters a token multiplies through
    (:meth:`~datarax.specs.model_specs.TransformerSpec.matmul_params`: the routed experts
    ``experts_per_token`` times, the router and the unembedding included, the embedding
    lookup and the norms not), plus attention's ``QK^T`` and ``AV`` with the causal mask
    counted: half of :meth:`~datarax.specs.model_specs.TransformerSpec.
    attention_flops_per_token`, forward and backward (``3 * layers * seq_len * heads *
    (qk + v)``). The MLP's is ``6 N``. What ``step_estimate.flops``, ``mfu``,
    ``tflops_per_device`` and the roofline count; remat's recompute and the dense MoE
    kernel's padding and masks are time, not model FLOPs."""
    flops = 6.0 * model.matmul_params()
    if isinstance(model, TransformerSpec):
        flops += 0.5 * model.attention_flops_per_token()
    return flops


def _dense_moe_flops(model: TransformerSpec, routed: float) -> tuple[float, float, float, float]:
    """``(experts forward, experts backward, masks forward, masks backward)`` FLOPs per
    token of the dense (capacity) kernel, on the matmul units: MaxText's
    ``dense_matmul`` (``layers/moe.py`` at the tpu-recipes-v0.1.2 tag, commit
    ``14b5876ea857c09cc3d8645385f984689376a331``) pads every expert to its capacity,
    ``C = ceil(S k / E) * capacity_factor`` rows a sequence, so the ``routed`` expert
    FLOPs scale by ``capacity_factor``; and it dispatches and combines through einsums
    with ``[S, E, C]`` one-hot masks (``BSM,BSEC -> EBCM`` and back), ``2 E C d`` FLOPs a
    token each, about ``2 S k capacity_factor d``: two forward, three backward (the input
    gradient of the dispatch; the combine's gradients to the experts' output and to its
    router-weighted mask). MaxText's own FLOP count leaves the masks' einsums out, and so
    does ``model_flops`` here: they are time, not model FLOPs. The experts' padded
    matmuls are batched over the experts, as the sparse kernel's grouped matmuls are,
    and priced with them (``Calibration.grouped_matmul``); the masks' einsums are plain
    matmuls."""
    cf = model.capacity_factor
    mask = 2.0 * model.seq_len * model.experts_per_token * cf * model.d_model * model.moe_layers
    return 2.0 * routed * cf, 4.0 * routed * cf, 2.0 * mask, 3.0 * mask


_INDEPENDENT = ("indep_mm_fwd", "indep_mm_bwd", "indep_gmm_bwd")


def a2a_independent(
    model: ModelSpec, experts: tuple[float, float, float, float], scale: float
) -> tuple[float, float, float]:
    """The work of each pass that does not wait on the experts' all-to-all, which alone can
    hide it: ``(forward, backward)`` matmul seconds at peak (priced at the matmul
    fraction) and backward grouped-matmul seconds at peak (at the grouped one), the
    components ``indep_mm_fwd``, ``indep_mm_bwd``, ``indep_gmm_bwd``; ``scale`` is tokens
    over shards over peak.

    The rule: a mixture-of-experts layer's dispatch waits for the router, the experts'
    matmuls for the dispatch, the combine for the experts and the next layer for the
    combine, so the layer's own compute cannot run under its all-to-all. What can: the
    shared experts (MaxText's ``RoutedAndSharedMoE``, Megatron's shared experts) read the
    layer's input, not the dispatched tokens, forward and backward; and in the backward
    pass the routed experts' weight gradients (half of their backward FLOPs: they need the
    dispatched tokens and the output gradient, not the input gradient the dispatch's
    backward all-to-all carries). Nothing else (a pipeline's stages run in lockstep in
    MaxText's loop; the other collectives are no compute). A model without shared experts
    therefore exposes its whole forward all-to-all."""
    if not isinstance(model, TransformerSpec) or not model.is_moe:
        return 0.0, 0.0, 0.0
    mats = 3 if model.mlp == "gated" else 2
    shared = model.moe_layers * model.shared_experts * mats * model.d_model * model.moe_d_ff
    return 2.0 * shared * scale, 4.0 * shared * scale, 0.5 * experts[1] * scale


def _elementwise_bytes_per_token(model: ModelSpec, t: int) -> float:
    """HBM bytes per token of one forward pass's memory-bound work (norms, rotary,
    residual adds, the MLP activation, softmax of ``dot`` attention): each layer reads
    and writes the ``d``-wide residual stream about ten times and the ``d_ff``-wide
    hidden three times (gated) or twice; the head reads the logits twice. An
    order-of-magnitude count: XLA fuses much of it into the matmuls' prologues, which
    the fitted ``hbm`` fraction absorbs."""
    if not isinstance(model, TransformerSpec):
        return 0.0
    b = DTYPE_BYTES[model.dtype]
    d, f = model.d_model, model.ffn_width
    hidden = (3 if model.mlp == "gated" else 2) * f / t
    scores = 3 * model.heads * model.seq_len / t if model.attention == "dot" else 0
    layer = b * (10 * d + hidden + scores)
    return model.layers * layer + 2 * b * model.vocab / t


def predict_step(
    model: ModelSpec,
    hw: Hardware,
    ctx: MeshContext,
    *,
    calibration: Calibration | None = None,
    **inputs: Any,
) -> StepPrediction:
    """Predicted wall time of one training step on one device, and what makes it up.

    The model (per device; ``t`` the context's compute shards, the width axes times the
    stages; tokens this device's data and context shard):

    - matmuls: ``(6 N tokens + recomputed forward) / t`` FLOPs at ``matmul`` times the
      compute dtype's peak (``Hardware.peak_flops``);
    - attention: ``flash`` skips the causal half and its backward kernel is 2.5x its
      forward (it recomputes the scores: five matmuls for two); priced at
      ``attention`` times peak. ``dot`` computes all of ``S x S`` (forward 1x, backward
      2x) at the matmul fraction;
    - memory-bound work: the elementwise bytes (:func:`_elementwise_bytes_per_token`,
      forward, twice in the backward pass, again where recomputed) and the optimizer
      update (parameters, moments and gradient: 7 passes over this device's parameter
      bytes with Adam) at ``hbm`` times HBM bandwidth;
    - collectives: each pass's collectives (``collectives``' ``seconds`` per phase, ring
      alpha-beta on their links, over ``link``, plus ``collective_s`` an op) run under
      that pass's compute; up to ``overlap`` of the compute time hides them, the rest is
      exposed. The experts' all-to-all hides only behind the work that does not wait on
      it (:func:`a2a_independent`), up to ``all_to_all_overlap`` (else ``overlap``) of it;
    - offload: activations moved to host memory cross the host link once each way
      (out in the forward pass, back in the backward pass), hidden like collectives;
    - plus ``overhead_s``, and ``layer_s`` for each transformer layer the device runs
      (both in the breakdown's ``overhead_s``).

    Args:
      model: the spec.
      hw: the hardware.
      ctx: the request's mesh context (its tokens, shard counts and pipeline).
      calibration: constants; default :data:`CALIBRATION` for ``hw.kind``.
      inputs: :func:`step_components`' keywords:
      param_bytes: bytes of this device's parameter shards.
      collectives: :func:`cost.estimate_step`'s entries (``phase``, ``seconds``).
      host_offload_bytes: bytes this device offloads per step.
      optimizer: its name (the update's passes over the state).
      padded: the framework pads the sparse kernel's experts to ``capacity_factor``
        (Megatron's, under a PyTorch profile); MaxText's sparse kernel does not.

    Returns:
      A :class:`~datarax.estimate.results.StepPrediction` (``breakdown``:
      ``matmul_s``, ``attention_s``, ``memory_bound_s``, ``exposed_comm_s``,
      ``offload_s``, ``overhead_s``; ``components``: :func:`step_components`):
      ``roofline_s`` is the model
      FLOPs (plus what remat recomputes) at peak, each pass taking the longer of its compute and its
      collectives, ``roofline_phases`` those two per pass;
      ``gap`` says in one line what the difference is made of.
    """
    cal = calibration or CALIBRATION.get(hw.kind, CALIBRATION["gpu"])
    parts = step_components(model, hw, ctx, **inputs)
    return combine(parts, cal)


def step_components(
    model: ModelSpec,
    hw: Hardware,
    ctx: MeshContext,
    *,
    param_bytes: int,
    collectives: Sequence[Mapping[str, Any]],
    host_offload_bytes: int,
    optimizer: str = "adam",
    padded: bool = False,
) -> dict[str, float]:
    """The step's parts in seconds at 100% of peak and of HBM bandwidth, before
    calibration (see :func:`predict_step`; :func:`combine` applies a
    :class:`Calibration`): ``mm_fwd``, ``mm_bwd`` (matmuls), ``flash_fwd``,
    ``flash_bwd`` (fused attention), ``dot_fwd``, ``dot_bwd`` (materialized attention,
    priced as matmuls), ``mem_fwd``, ``mem_bwd`` (memory-bound), ``comm_fwd``,
    ``comm_bwd`` (collectives), ``calls_fwd``, ``calls_bwd`` (their ops), ``layers`` (the
    transformer layers this device runs), ``offload`` (one way), ``roofline_fwd``,
    ``roofline_bwd``, ``model_flops``, ``ring_fwd``, ``ring_bwd`` (the ring's key and value
    passes, hidden behind the attention they feed), ``bubble_fraction``.

    Pipeline stages divide a device's work: it runs its stage's layers for its data
    shard's tokens and the head for their share over the stages, ``1 / stages`` of the
    model's work either way; the schedule's bubble (``bubble_fraction`` of the step)
    comes on top (:func:`combine`). A context axis divides the tokens (``tokens`` is
    this device's share of the sequence); without ``load_balance`` a causal mask leaves
    the last shard ``(2 context - 1) / context`` times the mean's attention work, which
    the step waits for."""
    t, tokens = ctx.compute_shards, ctx.tokens
    bubble_fraction = ctx.pipeline.bubble_fraction if ctx.pipeline else 0.0
    load_balance = ctx.options.context.load_balance
    peak = hw.peak_flops(model.dtype)
    n_matmul = model.matmul_params()
    routed_model = 0.0
    # the routed experts' matmuls (forward, backward: Calibration.grouped_matmul) and the
    # dense kernel's dispatch/combine masks (forward, backward: plain matmuls), per token
    experts = (0.0, 0.0, 0.0, 0.0)
    if isinstance(model, TransformerSpec) and model.is_moe:
        routed_model = float(model.routed_matmul_params())
        n_matmul -= model.routed_matmul_params()
        if model.moe_kernel == "sparse" and (not padded or model.dropless):
            experts = (2.0 * routed_model, 4.0 * routed_model, 0.0, 0.0)
        elif model.moe_kernel == "sparse":  # grouped GEMMs padded to capacity, no masks
            cf = model.capacity_factor
            experts = (2.0 * routed_model * cf, 4.0 * routed_model * cf, 0.0, 0.0)
        else:
            experts = _dense_moe_flops(model, routed_model)
    if isinstance(model, TransformerSpec):
        attn_fwd = model.layers * attention_forward_flops(model)
        flash = model.attention == "flash"
    else:
        attn_fwd, flash = 0.0, False
    re_mm, re_attn = recompute_flops_per_token(model)
    per_device = tokens / t
    if flash:  # the causal half skipped; the backward kernel recomputes the scores
        cp = ctx.sequence_shards
        slowest = 1.0 if load_balance or cp <= 1 else (2 * cp - 1) / cp
        at_fwd, at_bwd = 0.5 * slowest * attn_fwd, 0.5 * slowest * (2.5 * attn_fwd + re_attn)
    else:
        at_fwd, at_bwd = attn_fwd, 2.0 * attn_fwd + re_attn
    elem = _elementwise_bytes_per_token(model, t) * tokens
    re_share = (re_mm / (2.0 * n_matmul)) if n_matmul else 0.0
    hbm = max(hw.hbm_bytes_per_s, 1.0)
    comm = {"forward": 0.0, "backward": 0.0}
    ring = {"forward": 0.0, "backward": 0.0}
    a2a = {"forward": 0.0, "backward": 0.0}
    calls = {"forward": 0, "backward": 0}
    for entry in collectives:
        comm[entry["phase"]] += float(entry["seconds"])
        calls[entry["phase"]] += int(entry["count"])
        if entry["kind"] == "all-to-all":
            a2a[entry["phase"]] += float(entry["seconds"])
        if entry["kind"] == "send-recv" and entry["what"] == "keys and values":
            ring[entry["phase"]] += float(entry["seconds"])
    link = hw.host_link_bytes_per_s
    model_flops = model_flops_per_token(model) * per_device
    return {
        "mm_fwd": (2.0 * n_matmul + experts[2]) * per_device / peak,
        "mm_bwd": (4.0 * n_matmul + re_mm + experts[3]) * per_device / peak,
        "gmm_fwd": experts[0] * per_device / peak,
        "gmm_bwd": experts[1] * per_device / peak,
        "flash_fwd": at_fwd * per_device / peak if flash else 0.0,
        "flash_bwd": at_bwd * per_device / peak if flash else 0.0,
        "dot_fwd": 0.0 if flash else at_fwd * per_device / peak,
        "dot_bwd": 0.0 if flash else at_bwd * per_device / peak,
        "mem_fwd": elem / hbm,
        "mem_bwd": ((2 + re_share) * elem + _UPDATE_PASSES.get(optimizer, 7) * param_bytes) / hbm,
        "comm_fwd": comm["forward"],
        "comm_bwd": comm["backward"],
        "calls_fwd": float(calls["forward"]),
        "calls_bwd": float(calls["backward"]),
        "layers": model.layers / ctx.layer_shards if isinstance(model, TransformerSpec) else 0.0,
        "offload": host_offload_bytes / link if link > 0 and host_offload_bytes else 0.0,
        "roofline_fwd": model_flops / 3 / peak,
        "roofline_bwd": 2 * model_flops / 3 / peak + re_mm * per_device / peak,
        "model_flops": model_flops,
        "recompute": float(re_mm + re_attn > 0),
        "ring_fwd": ring["forward"],
        "ring_bwd": ring["backward"],
        "a2a_fwd": a2a["forward"],
        "a2a_bwd": a2a["backward"],
        **dict(zip(_INDEPENDENT, a2a_independent(model, experts, per_device / peak), strict=True)),
        "bubble_fraction": bubble_fraction,
    }


def combine(parts: Mapping[str, float], cal: Calibration) -> StepPrediction:
    """:func:`predict_step`'s answer from :func:`step_components` and constants."""
    gmm_fwd = parts.get("gmm_fwd", 0.0) / cal.grouped
    gmm_bwd = parts.get("gmm_bwd", 0.0) / cal.grouped
    fwd = (
        (parts["mm_fwd"] + parts["dot_fwd"]) / cal.matmul
        + gmm_fwd
        + parts["flash_fwd"] / cal.attention
        + parts["mem_fwd"] / cal.hbm
    )
    bwd = (
        (parts["mm_bwd"] + parts["dot_bwd"]) / cal.matmul
        + gmm_bwd
        + parts["flash_bwd"] / cal.attention
        + parts["mem_bwd"] / cal.hbm
    )
    offload = parts["offload"]
    # the ring's passes run under the attention of the shard at hand
    hidden = {p: min(parts.get(f"ring_{p}", 0.0) / cal.link, parts[f"flash_{p}"] / cal.attention)
              for p in ("fwd", "bwd")}  # fmt: skip
    # the experts' all-to-all sits between the router and the experts' matmuls (and
    # between those and the next layer): only work that does not wait on it can hide it
    # (:func:`a2a_independent`), up to ``all_to_all_overlap`` (else ``overlap``) of it
    a2a = {p: parts.get(f"a2a_{p}", 0.0) / cal.link for p in ("fwd", "bwd")}
    share = cal.overlap if cal.all_to_all_overlap is None else cal.all_to_all_overlap
    free = {
        p: parts.get(f"indep_mm_{p}", 0.0) / cal.matmul
        + parts.get(f"indep_gmm_{p}", 0.0) / cal.grouped
        for p in ("fwd", "bwd")
    }
    a2a_hidden = {p: min(a2a[p], share * free[p]) for p in ("fwd", "bwd")}
    a2a_exposed = sum(a2a[p] - a2a_hidden[p] for p in ("fwd", "bwd"))
    comm = {p: parts[f"comm_{p}"] / cal.link + parts.get(f"calls_{p}", 0.0) * cal.collective_s
            for p in ("fwd", "bwd")}  # fmt: skip
    comm_fwd = comm["fwd"] - hidden["fwd"] - a2a["fwd"]
    comm_bwd = comm["bwd"] - hidden["bwd"] - a2a["bwd"]
    # what hides the all-to-all is not there for the other collectives
    budget_fwd = max(0.0, cal.overlap * fwd - a2a_hidden["fwd"])
    budget_bwd = max(0.0, cal.overlap * bwd - a2a_hidden["bwd"])
    exposed_fwd = max(0.0, comm_fwd + offload - budget_fwd)
    exposed_bwd = max(0.0, comm_bwd + offload - budget_bwd) + a2a_exposed
    bubble = parts.get("bubble_fraction", 0.0)
    bubble_s = (fwd + bwd) * bubble / (1.0 - bubble)
    fixed_s = cal.overhead_s + parts.get("layers", 0.0) * cal.layer_s
    step_s = fwd + bwd + exposed_fwd + exposed_bwd + bubble_s + fixed_s
    roof_fwd, roof_bwd = parts["roofline_fwd"], parts["roofline_bwd"]
    roofline_s = max(roof_fwd, parts["comm_fwd"]) + max(roof_bwd, parts["comm_bwd"])
    roofline_s += (roof_fwd + roof_bwd) * bubble / (1.0 - bubble)
    exposed_comm = max(0.0, comm_fwd - budget_fwd) + max(0.0, comm_bwd - budget_bwd) + a2a_exposed
    breakdown = StepBreakdown(
        matmul_s=(parts["mm_fwd"] + parts["mm_bwd"] + parts["dot_fwd"] + parts["dot_bwd"])
        / cal.matmul
        + gmm_fwd
        + gmm_bwd,
        attention_s=(parts["flash_fwd"] + parts["flash_bwd"]) / cal.attention,
        memory_bound_s=(parts["mem_fwd"] + parts["mem_bwd"]) / cal.hbm,
        exposed_comm_s=exposed_comm,
        offload_s=max(0.0, exposed_fwd + exposed_bwd - exposed_comm),
        overhead_s=fixed_s,
        bubble_s=bubble_s,
    )
    return StepPrediction(
        step_s=step_s,
        roofline_s=roofline_s,
        breakdown=breakdown,
        model_flops_per_device=parts["model_flops"],
        roofline_phases=RooflinePhases(
            forward=RooflinePhase(compute_s=roof_fwd, comm_s=parts["comm_fwd"]),
            backward=RooflinePhase(compute_s=roof_bwd, comm_s=parts["comm_bwd"]),
        ),
        gap=_gap_line(roofline_s, step_s, breakdown, cal, parts["recompute"] > 0),
        components=dict(parts),
    )


def _gap_line(
    roofline_s: float, step_s: float, parts: StepBreakdown, cal: Calibration, remat: bool
) -> str:
    if roofline_s <= 0:
        return "no compute: nothing to compare"
    words = [
        f"matmuls at {cal.matmul:.0%} of peak",
        f"flash attention at {cal.attention:.0%}",
        f"memory-bound work {parts.memory_bound_s:.3g} s",
    ]
    if remat:
        words.append("remat recompute")
    if parts.exposed_comm_s > 0:
        words.append(f"exposed collectives {parts.exposed_comm_s:.3g} s")
    if parts.offload_s > 0:
        words.append(f"exposed offload {parts.offload_s:.3g} s")
    if parts.bubble_s > 0:
        words.append(f"pipeline bubble {parts.bubble_s:.3g} s")
    return f"{step_s / roofline_s:.2f}x the roofline: " + ", ".join(words)
