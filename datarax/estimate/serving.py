"""Serving estimates (DESIGN v1.4, "Serving plans"): a deployment's time to first token,
time per output token and throughput under continuous batching, from its memory
(:mod:`datarax.estimate.serving_memory`) and a serving profile
(:mod:`datarax.estimate.serving_profiles`). Plain arithmetic; nothing touches a device.

One forward pass on one device (:class:`Pass`) costs its matmul FLOPs at ``matmul`` of
the weight dtype's peak (float8 and int8 weights run the matmuls at twice the bfloat16
peak where the chip has such units: :data:`LOW_PRECISION_PEAK`), its attention FLOPs at
``attention`` of peak, its HBM reads (the weights it multiplies through, and the KV cache
its tokens attend to) at ``hbm`` of the bandwidth, its tensor-parallel all-reduces (two a
layer, of the tokens' residual stream), the experts' all-to-all (dispatch and combine of
each mixture-of-experts layer) and the stages' sends on the links their axes cross
(:func:`datarax.estimate.cost.collective_seconds`), and the profile's fixed times::

    pass = max(compute, hbm) + (1 - overlap) x min(compute, hbm)
           + collectives + overhead_s + layers x layer_s

where ``compute`` is the matmuls and attention, ``hbm`` the reads, and ``overlap`` the
profile's share of the shorter of them that hides behind the longer (1: a roofline).

- **Prefill** of one prompt (``prefill_s``): the prompt's tokens in one pass on each
  stage, in turn: compute-bound but for short prompts (the weights read once).
- **Decode** (``decode_step_s``): the batch's sequences each add one token; each stage
  runs ``batch / stage`` of them at a time (a pipeline keeps every stage busy), so a
  round over the stages gives every sequence one token. A step reads the weights once
  (memory-bound at small batches, compute-bound at large ones) and each sequence's KV
  cache at its mean length ``input_tokens + output_tokens / 2``. A mixture-of-experts
  layer reads only the experts the step's tokens reach: of ``E`` experts with ``k`` a
  token, ``E x (1 - (1 - k / E) ** tokens)`` are expected.
- **Continuous batching**: a replica's ``batch`` slots each serve requests one after
  another; while every slot completes one request, the replica runs ``batch`` prefills
  (batched into the engine's chunk, :data:`~datarax.estimate.serving_memory.
  ENGINE_CHUNK_TOKENS`) and ``output_tokens`` decode rounds::

      cycle = batch x prefill share + output_tokens x decode round
      requests_per_s = replicas x batch / cycle
      output_tokens_per_s = requests_per_s x output_tokens
      tpot_s = decode round + (batch - 1) x prefill share / output_tokens
      ttft_s = prefill_s + decode step / 2 + queue wait

  where the queue wait is Little's law's: with ``concurrency`` clients over the
  replicas' slots, each waits ``clients / request rate - time in service`` when that is
  positive.

``bottleneck`` is the largest of the cycle's compute, HBM and collective seconds.

Example:
  >>> est = estimate_serving("h100-sxm", [], {"name": "llama3.1-8b"},
  ...                        {"input_tokens": 1000, "output_tokens": 1000, "concurrency": 64})
  >>> est.serving_estimate.bottleneck, est.memory_per_device.fits
  ('memory', True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from datarax.answers.calibrations import CalibrationConstants, CalibrationProfile
from datarax.answers.serving import ServingEstimate, ServingMemory
from datarax.estimate.cost import collective_seconds
from datarax.estimate.serving_memory import (
    ServingCapacity,
    ServingLayout,
    ServingOptions,
    chunk_tokens,
    serving_capacity,
    serving_layout,
    weights_bytes_per_device,
)
from datarax.estimate.serving_profiles import serving_profile
from datarax.hardware.chips import AxisLink, Hardware, get_hardware
from datarax.specs.model_specs import ModelSpec, TransformerSpec, model_spec

__all__ = [
    "LOW_PRECISION_PEAK",
    "Pass",
    "ServingPlan",
    "decode_pass",
    "estimate_serving",
    "prefill_pass",
    "reached_experts",
]

LOW_PRECISION_PEAK: dict[str, dict[str, float]] = {
    "float8": {"h100-sxm": 2.0, "h100-a3-high": 2.0, "h200-sxm": 2.0, "b200": 2.0,
               "gb200-nvl72": 2.0, "tpu7x": 2.0},
    "int8": {"tpu-v5e": 2.0, "tpu-v5p": 2.0, "tpu-v6e": 2.0, "a100-sxm": 2.0,
             "h100-sxm": 2.0, "h100-a3-high": 2.0, "h200-sxm": 2.0},
}  # fmt: skip
"""``{weight_dtype: {hardware: matmul peak over bf16's}}``: FP8 tensor cores (Hopper,
Blackwell, Ironwood) and int8 units (TPU v5e, v5p and v6e's int8 TOPS, Ampere's and
Hopper's INT8 tensor cores) run W8A8 matmuls at twice the bf16 peak, per their
datasheets; int4 weights (W4A16) are dequantized to bf16 and run at its peak."""

type Bottleneck = Literal["compute", "memory", "communication"]

_ACT = 2  # bytes of a bfloat16 activation element


@dataclass(frozen=True)
class Pass:
    """One forward pass on one device, its parts in seconds."""

    compute_s: float
    memory_s: float
    comm_s: float
    fixed_s: float
    overlap: float = 1.0
    """the share of the shorter of compute and HBM time hidden behind the longer"""

    @property
    def seconds(self) -> float:
        longer, shorter = max(self.compute_s, self.memory_s), min(self.compute_s, self.memory_s)
        return longer + (1.0 - self.overlap) * shorter + self.comm_s + self.fixed_s

    def scaled(self, factor: float) -> Pass:
        return Pass(
            self.compute_s * factor,
            self.memory_s * factor,
            self.comm_s * factor,
            self.fixed_s * factor,
            self.overlap,
        )


def reached_experts(experts: int, per_token: int, tokens: float) -> float:
    """Expected distinct experts ``tokens`` tokens reach, each going to ``per_token`` of
    ``experts``: ``E x (1 - (1 - k / E) ** tokens)``."""
    if experts <= 1 or tokens <= 0:
        return float(min(experts, 1))
    miss: float = (1.0 - per_token / experts) ** tokens
    return experts * (1.0 - miss)


@dataclass(frozen=True)
class _Context:
    """What every pass of one plan reads, built once."""

    model: TransformerSpec
    hw: Hardware
    layout: ServingLayout
    options: ServingOptions
    constants: CalibrationConstants
    links: Mapping[str, AxisLink]
    kv_bytes_per_token: int
    weights_dense: float
    weights_experts: float

    @property
    def peak(self) -> float:
        speedup = LOW_PRECISION_PEAK.get(self.options.weight_dtype, {}).get(self.hw.name, 1.0)
        return self.hw.peak_flops("bfloat16") * speedup

    @property
    def layers(self) -> int:
        """Layers one device runs (its stage's)."""
        return math.ceil(self.model.layers / self.layout.stage)

    def collectives(self, kind: str, op: str, bytes_per_device: float, count: float) -> float:
        """``count`` collectives ``op`` of ``bytes_per_device`` over the axes of ``kind``
        (in turn, where several), at the profile's ``link`` and ``collective_s``."""
        seconds = 0.0
        for axis in self.layout.axes_of(kind):
            link = self.links.get(axis)
            if link is None:
                continue
            one = collective_seconds(op, bytes_per_device, link, self.hw) / self.constants.link
            seconds += count * (one + self.constants.collective_s)
        return seconds


def _matmul_flops(model: TransformerSpec, layout: ServingLayout) -> tuple[float, float, float]:
    """Per token, one device of a stage, forward: ``(dense, routed, unembedding)`` matmul
    FLOPs (``2 x`` the weights multiplied through; the routed experts at their
    ``experts_per_token`` share, all of them over ``tensor x expert`` devices)."""
    dense = routed = head = 0.0
    t, stages = layout.tensor, layout.stage
    for group in model.params():
        if not group.matmul:
            continue
        per_layer = math.prod(group.shape)
        share = 1.0 / t if group.tensor_dim() is not None else 1.0
        if group.path.startswith("unembed"):
            head += 2 * per_layer * share
        elif group.expert:
            k_share = model.experts_per_token / model.num_experts
            routed += 2 * per_layer * k_share * group.repeat / stages / (t * layout.expert)
        else:
            dense += 2 * per_layer * share * group.repeat / stages
    if model.tied_embeddings:
        head += 2 * model.vocab * model.d_model / t
    return dense, routed, head


def _attention_flops(model: TransformerSpec, layers: int, tensor: int, contexts: float) -> float:
    """Attention FLOPs of one device's heads over ``layers`` for queries whose key counts
    sum to ``contexts``: ``2 x (qk + v)`` per head and key (``QK^T`` and ``AV``; MLA's
    heads at their nope + rope and value widths)."""
    width = model.qk_head_dim + model.value_head_dim
    return 2.0 * layers * model.heads / tensor * width * contexts


def _pass(
    ctx: _Context,
    *,
    tokens: float,
    sequences: float,
    contexts: float,
    kv_read_tokens: float,
) -> Pass:
    """One forward pass of ``tokens`` new tokens in ``sequences`` sequences on one device
    of each stage (``contexts``: the keys their queries attend to, summed;
    ``kv_read_tokens``: cached tokens read from HBM)."""
    model, layout, c = ctx.model, ctx.layout, ctx.constants
    dense, routed, head = _matmul_flops(model, layout)
    # the sequences spread over the expert devices (each sequence on one of them)
    spread = min(float(layout.expert), max(1.0, sequences))
    local = tokens / spread
    matmul_s = (dense * local + head * sequences / spread) / (ctx.peak * c.matmul)
    matmul_s += routed * tokens / (ctx.peak * c.grouped)
    attention_s = _attention_flops(model, ctx.layers, layout.tensor, contexts / spread) / (
        ctx.hw.peak_flops("bfloat16") * c.attention
    )
    reached = 1.0
    if model.is_moe:
        reached = reached_experts(model.num_experts, model.experts_per_token, tokens)
        reached /= model.num_experts
    weights = ctx.weights_dense + ctx.weights_experts * reached
    memory_s = (weights + kv_read_tokens / spread * ctx.kv_bytes_per_token) / (
        ctx.hw.hbm_bytes_per_s * c.hbm
    )
    stream = local * model.d_model * _ACT
    comm_s = ctx.collectives("tensor", "all-reduce", stream, 2 * ctx.layers)
    if model.is_moe and layout.expert > 1:
        moe_layers = math.ceil(model.moe_layers / layout.stage)
        dispatch = local * model.experts_per_token * model.d_model * _ACT
        comm_s += ctx.collectives("expert", "all-to-all", dispatch, 2 * moe_layers)
    fixed_s = c.overhead_s + ctx.layers * c.layer_s
    return Pass(matmul_s + attention_s, memory_s, comm_s, fixed_s, c.overlap)


def _send_s(ctx: _Context, tokens: float) -> float:
    """One stage's send of ``tokens`` tokens' residual stream to the next."""
    return ctx.collectives("stage", "send-recv", tokens * ctx.model.d_model * _ACT, 1)


def prefill_pass(ctx: _Context, sequences: float) -> Pass:
    """One stage's pass over ``sequences`` prompts of ``input_tokens`` (causal: each
    prompt's ``L`` queries attend to ``L (L + 1) / 2`` keys)."""
    n = ctx.options.input_tokens
    return _pass(
        ctx,
        tokens=n * sequences,
        sequences=sequences,
        contexts=sequences * n * (n + 1) / 2,
        kv_read_tokens=0.0,
    )


def decode_pass(ctx: _Context, sequences: float) -> Pass:
    """One stage's decode pass over ``sequences`` sequences at the mean cached length
    ``input_tokens + output_tokens / 2``."""
    cached = ctx.options.input_tokens + ctx.options.output_tokens / 2
    return _pass(
        ctx,
        tokens=sequences,
        sequences=sequences,
        contexts=sequences * cached,
        kv_read_tokens=sequences * cached,
    )


@dataclass(frozen=True)
class ServingPlan:
    """:func:`estimate_serving`'s answer: the plan's ``serving_estimate`` and its
    ``memory_per_device``, with the layout and the model priced."""

    serving_estimate: ServingEstimate
    memory_per_device: ServingMemory
    layout: ServingLayout
    model: TransformerSpec
    options: ServingOptions


@dataclass(frozen=True)
class _Times:
    prefill_s: float
    decode_step_s: float
    tpot_s: float
    ttft_s: float
    requests_per_s: float
    bottleneck: Bottleneck


def _times(ctx: _Context, capacity: ServingCapacity) -> _Times:
    """The priced batch's prefill, decode, cycle and latencies (module docstring)."""
    options, layout = ctx.options, ctx.layout
    batch, stages = capacity.batch, layout.stage
    alone = prefill_pass(ctx, 1)
    send_prefill = _send_s(ctx, options.input_tokens)
    prefill_s = stages * alone.seconds + (stages - 1) * send_prefill
    prompts = min(chunk_tokens(options), batch * options.input_tokens) / options.input_tokens
    chunk = max(1.0, prompts)
    chunked = prefill_pass(ctx, chunk)
    # a pipeline overlaps its stages' prefills: a prompt costs the replica one stage's share
    prefill_share = chunked.scaled(1.0 / chunk)
    microbatch = max(1.0, batch / stages)
    step = decode_pass(ctx, microbatch)
    send_decode = _send_s(ctx, microbatch)
    decode_round = stages * step.seconds + (stages - 1) * send_decode
    output = options.output_tokens
    cycle = batch * prefill_share.seconds + output * decode_round
    per_replica = batch / cycle
    tpot = decode_round + (batch - 1) * prefill_share.seconds / output
    ttft = prefill_s + step.seconds / 2
    if options.concurrency is not None:
        clients = options.concurrency / layout.replicas
        in_service = ttft + max(0, output - 1) * tpot
        ttft += max(0.0, clients / per_replica - in_service)
    parts: dict[Bottleneck, float] = {
        "compute": batch * prefill_share.compute_s + output * stages * step.compute_s,
        "memory": batch * prefill_share.memory_s + output * stages * step.memory_s,
        "communication": batch * prefill_share.comm_s
        + output * (stages * step.comm_s + (stages - 1) * send_decode),
    }
    return _Times(
        prefill_s=prefill_s,
        decode_step_s=step.seconds,
        tpot_s=tpot,
        ttft_s=ttft,
        requests_per_s=per_replica * layout.replicas,
        bottleneck=max(parts, key=lambda k: parts[k]),
    )


def estimate_serving(
    hardware: str | Hardware,
    axes_detail: Sequence[AxisLink],
    model: ModelSpec | Mapping[str, Any],
    serving: ServingOptions | Mapping[str, Any],
    *,
    roles: Mapping[str, str] | None = None,
    calibration: str | CalibrationProfile | None = None,
) -> ServingPlan:
    """Prices a serving deployment of ``model`` on a mesh of ``hardware``.

    Args:
      hardware: catalog name or entry.
      axes_detail: one :class:`AxisLink` per mesh axis, mesh order (a hardware plan's
        ``axes_detail``); ``[]``: one device.
      model: a transformer spec or a request's ``model`` object.
      serving: the request's ``serving`` object or its :class:`ServingOptions`.
      roles: ``{axis: kind}`` where the names do not say it (``tensor``, ``expert``,
        ``stage``, ``data``).
      calibration: a serving profile id (default ``published-<kind>-<engine>``).

    Returns:
      :class:`ServingPlan`: the ``serving_estimate`` and ``memory_per_device`` answers.

    Raises:
      PlanError: ``unknown_hardware``, ``invalid_model``, ``invalid_serving``,
        ``unknown_axis_role``, ``invalid_parallelism``, ``tensor_not_divisible``,
        ``unknown_calibration``, ``invalid_calibration``.
    """
    hw = get_hardware(hardware)
    options = serving if isinstance(serving, ServingOptions) else ServingOptions.from_json(serving)
    spec = model_spec(model)
    axes = {link.name: link.size for link in axes_detail}
    layout = serving_layout(spec, axes, roles)
    assert isinstance(spec, TransformerSpec)  # serving_layout refuses the others
    profile = serving_profile(hw, options.engine, calibration)
    assert profile.constants is not None
    capacity = serving_capacity(spec, hw, layout, options)
    routed = weights_bytes_per_device(spec, layout, options.weight_dtype, routed_share=1.0)
    dense = weights_bytes_per_device(spec, layout, options.weight_dtype, routed_share=0.0)
    ctx = _Context(
        model=spec,
        hw=hw,
        layout=layout,
        options=options,
        constants=profile.constants,
        links={link.name: link for link in axes_detail},
        kv_bytes_per_token=capacity.kv_bytes_per_token,
        weights_dense=dense,
        weights_experts=routed - dense,
    )
    times = _times(ctx, capacity)
    devices = layout.devices_per_replica * layout.replicas
    tokens_per_s = times.requests_per_s * options.output_tokens
    estimate = ServingEstimate(
        replicas=layout.replicas,
        weights_bytes=capacity.weights_bytes,
        kv_bytes_per_token=capacity.kv_bytes_per_token,
        kv_capacity_tokens=capacity.kv_capacity_tokens,
        max_batch=capacity.max_batch,
        batch=capacity.batch,
        ttft_s=times.ttft_s,
        tpot_s=times.tpot_s,
        output_tokens_per_s=tokens_per_s,
        requests_per_s=times.requests_per_s,
        bottleneck=times.bottleneck,
        calibration=profile.id,
        engine=options.engine,
        devices_per_replica=layout.devices_per_replica,
        prefill_s=times.prefill_s,
        decode_step_s=times.decode_step_s,
        output_tokens_per_s_per_device=tokens_per_s / devices,
    )
    return ServingPlan(estimate, capacity.memory, layout, spec, options)
