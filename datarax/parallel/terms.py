"""What each parallelism kind adds to a training step: the bytes its axes move (its
collectives) and the memory it adds beside the state and the activations. The registry's
entries (:data:`~datarax.parallel.kinds.KINDS`) carry these functions; the step-time and
memory estimates read them through the entries and never pick a kind by its name.

Each traffic term takes the request's :class:`~datarax.parallel.context.MeshContext` and
one axis of its kind (over 1) and gives what that axis moves per device in one step,
hardware-free: :mod:`datarax.estimate.cost` prices it on the axis's link. Each memory
term gives named parts of the step's transient bytes (``temporaries``).

Plain arithmetic over the model's description; no NumPy and no JAX.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from datarax.specs.flops import recompute_flops_per_token
from datarax.specs.model_specs import DTYPE_BYTES, ModelSpec, ParamGroup, TransformerSpec

if TYPE_CHECKING:
    from datarax.parallel.context import MeshContext

__all__ = [
    "MemoryTerm",
    "Traffic",
    "TrafficTerm",
    "context_kv_bytes",
    "context_traffic",
    "data_traffic",
    "expert_traffic",
    "gathered_param_traffic",
    "repeat_per_device",
    "sequence_traffic",
    "stage_pass_bytes",
    "stage_traffic",
    "tensor_activation_collectives",
    "tensor_traffic",
]


@dataclass(frozen=True)
class Traffic:
    """One collective an axis runs in a step, before pricing.

    Attributes:
      op: ``all-reduce``, ``all-gather``, ``reduce-scatter``, ``all-to-all`` or
        ``send-recv``, as ``step_estimate.collectives`` names them.
      phase: ``forward`` or ``backward``.
      what: what travels: ``params``, ``grads``, ``activations``, ``tokens`` or ``keys and
        values``. Parameters and gradients are combined by XLA's combiners (their latency
        is paid once per layer, :mod:`datarax.estimate.cost`).
      bytes_per_device: the array one device holds whole (all-gather: after;
        reduce-scatter and all-reduce: before), one op.
      count: how many such ops a step runs.
    """

    op: str
    phase: str
    what: str
    bytes_per_device: float
    count: int = 1


type TrafficTerm = Callable[["MeshContext", str], Iterator[Traffic]]
"""``term(context, axis)``: what one axis of the kind moves in a step."""

type MemoryTerm = Callable[["MeshContext"], Mapping[str, float]]
"""``term(context)``: named transient bytes the kind adds on each device (0 when its
axes are all 1)."""


def repeat_per_device(group: ParamGroup, stages: int) -> int:
    """How many of a group's stacked layers one device holds: a stacked per-layer group
    (``layers/*/...``) splits its layers over the stages (the most a stage holds, where
    they do not divide: a DeepSeek-V3's 3 dense layers over 8 stages leave 1 on some);
    every other group is whole on every stage."""
    if "*" not in group.path or stages <= 1:
        return group.repeat
    return -(-group.repeat // stages)


def _itemsizes(model: ModelSpec) -> tuple[int, int]:
    """``(compute dtype bytes, parameter dtype bytes)``."""
    return DTYPE_BYTES[model.dtype], DTYPE_BYTES[getattr(model, "param_dtype", model.dtype)]


def _param_shards(ctx: MeshContext) -> Iterator[tuple[ParamGroup, float, int, bool]]:
    """``(group, bytes this device keeps, layers it holds, fsdp_split)`` per group."""
    _, param_itemsize = _itemsizes(ctx.model)
    for group, _, shard, fsdp_split in ctx.specs:
        whole = math.prod(shard) * param_itemsize
        yield group, whole, repeat_per_device(group, ctx.layer_shards), fsdp_split


def gathered_param_traffic(ctx: MeshContext, axis: str) -> Iterator[Traffic]:
    """An axis that splits parameters as fsdp does (fsdp; the weights of context and
    expert axes but the routed experts, as MaxText's rules shard them): each group it
    splits is all-gathered where used, forward and backward, and its gradient
    reduce-scattered; a group it leaves whole (no dimension divides) has its gradient
    all-reduced over it instead."""
    size = ctx.axes[axis]
    for group, whole, repeat, fsdp_split in _param_shards(ctx):
        if axis not in ctx.gather_axes(group):
            continue
        if fsdp_split:
            gathered = whole * size
            yield Traffic("all-gather", "forward", "params", gathered, repeat)
            yield Traffic("all-gather", "backward", "params", gathered, repeat)
            yield Traffic("reduce-scatter", "backward", "grads", gathered, repeat)
        else:
            yield Traffic("all-reduce", "backward", "grads", whole, repeat)


def data_traffic(ctx: MeshContext, _axis: str) -> Iterator[Traffic]:
    """A replica axis: every gradient all-reduced whole; with ZeRO-1
    (``shard_over_data``) reduce-scattered to the optimizer's shards and the updated
    parameters all-gathered instead."""
    for _, whole, repeat, _ in _param_shards(ctx):
        if ctx.options.shard_over_data:
            yield Traffic("reduce-scatter", "backward", "grads", whole, repeat)
            yield Traffic("all-gather", "backward", "params", whole, repeat)
        else:
            yield Traffic("all-reduce", "backward", "grads", whole, repeat)


def tensor_activation_collectives(
    model: ModelSpec, tokens: float
) -> list[tuple[str, str, float, int]]:
    """``(phase, op, elements, count)`` of a tensor axis's activation all-reduces (an
    MLP's last col layer all-gathers its output for the loss). A transformer's per-layer
    all-reduces are one entry each, counted ``layers`` times in closed form, so the work
    does not grow with the layers."""
    out: list[tuple[str, str, float, int]] = []
    if isinstance(model, TransformerSpec):
        d = model.d_model
        # forward: embedding lookup (vocab-split) and each layer's o and down projections
        out.append(("forward", "all-reduce", tokens * d, 1 + 2 * model.layers))
        # backward: gradients into each layer's attention and MLP inputs, and into the
        # unembedding's input
        out.append(("backward", "all-reduce", tokens * d, 1 + 2 * model.layers))
        if recompute_flops_per_token(model)[0] > 0:  # recomputed o/down all-reduce again
            out.append(("backward", "all-reduce", tokens * d, 2 * model.layers))
        return out
    widths = model.features
    n_layers = len(widths) - 1
    for i in range(n_layers):
        if i % 2 == 1:  # row layer: its output is summed over the tensor axis
            out.append(("forward", "all-reduce", tokens * widths[i + 1], 1))
            if model.remat == "full":
                out.append(("backward", "all-reduce", tokens * widths[i + 1], 1))
        elif i > 0:  # col layer with an input gradient to sum
            out.append(("backward", "all-reduce", tokens * widths[i], 1))
    if n_layers % 2 == 1:  # the last layer is col: the loss needs the whole output
        out.append(("forward", "all-gather", tokens * widths[-1], 1))
        if model.remat == "full":
            out.append(("backward", "all-gather", tokens * widths[-1], 1))
    return out


def _stage_tokens(ctx: MeshContext) -> float:
    """The tokens whose activations cross one width-splitting axis: a stage's share of
    this device's (its layers only)."""
    return ctx.tokens // ctx.layer_shards


def tensor_traffic(ctx: MeshContext, _axis: str) -> Iterator[Traffic]:
    """A tensor axis (Megatron): the row matmuls' partial outputs all-reduced. Beside
    sequence axes the residual stream is already split along the sequence over them, so
    each all-reduce moves that share."""
    itemsize, _ = _itemsizes(ctx.model)
    tokens = _stage_tokens(ctx) / ctx.activation_sequence_shards
    for phase, op, elements, count in tensor_activation_collectives(ctx.model, tokens):
        yield Traffic(op, phase, "activations", elements * itemsize, count)


def sequence_traffic(ctx: MeshContext, _axis: str) -> Iterator[Traffic]:
    """A sequence axis (Megatron's sequence parallelism; MaxText's
    ``tensor_sequence``): the weights split as tensor splits them, and the activations
    between the tensor-parallel regions (norms, residual adds) split along the sequence.
    Each of tensor's all-reduces becomes a reduce-scatter into the sequence shards after
    the row matmul and an all-gather of them before the next col matmul: the same bytes
    on the wire (an all-reduce is a reduce-scatter then an all-gather), twice the ops.
    (Korthikanti et al. 2022, https://arxiv.org/abs/2205.05198, section 4.2.2.)"""
    itemsize, _ = _itemsizes(ctx.model)
    for phase, op, elements, n in tensor_activation_collectives(ctx.model, _stage_tokens(ctx)):
        if op == "all-reduce":
            yield Traffic("reduce-scatter", phase, "activations", elements * itemsize, n)
            yield Traffic("all-gather", phase, "activations", elements * itemsize, n)
        else:
            yield Traffic(op, phase, "activations", elements * itemsize, n)


def expert_traffic(ctx: MeshContext, axis: str) -> Iterator[Traffic]:
    """An expert axis: each MoE layer sends every routed copy of this device's tokens to
    its expert's shard and back (dispatch and combine), forward and again in the
    backward pass (their gradients): the routed rows, k per token, d wide. The dense
    (capacity) kernel moves its ``[E, B, C, d]`` dispatch tensor, every expert padded to
    its capacity ``C = ceil(S k / E) * capacity_factor`` rows a sequence: the routed rows
    times ``capacity_factor``. The other weights as fsdp
    (:func:`gathered_param_traffic`)."""
    model = ctx.model
    yield from gathered_param_traffic(ctx, axis)
    if isinstance(model, TransformerSpec) and model.is_moe:
        itemsize, _ = _itemsizes(model)
        routed: float = ctx.tokens * model.experts_per_token * model.d_model * itemsize
        if model.moe_kernel == "dense" and not model.dropless:
            routed *= model.capacity_factor
        moe_layers = -(-model.moe_layers // ctx.layer_shards)
        for phase in ("forward", "backward"):
            yield Traffic("all-to-all", phase, "tokens", routed, 2 * moe_layers)


def stage_traffic(ctx: MeshContext, _axis: str) -> Iterator[Traffic]:
    """A stage axis: the groups outside the pipeline (embedding, final norm, unembedding)
    are whole on every stage and their gradients all-reduced over it, as over data; each
    microbatch's activations pass to the next stage forward and their gradients back
    (``send-recv``, one per microbatch and repeat)."""
    for group, whole, repeat, _ in _param_shards(ctx):
        if "*" not in group.path:  # outside the stacked layers
            yield Traffic("all-reduce", "backward", "grads", whole, repeat)
    shape, model = ctx.pipeline, ctx.model
    if shape is not None and isinstance(model, TransformerSpec):
        itemsize, _ = _itemsizes(model)
        sends = shape.repeats * shape.microbatches
        volume = ctx.tokens / shape.microbatches * model.d_model * itemsize
        yield Traffic("send-recv", "forward", "activations", volume, sends)
        yield Traffic("send-recv", "backward", "activations", volume, sends)


def _local_kv_bytes(ctx: MeshContext) -> float:
    """Keys and values of this device's tokens, split over the width axes as the heads."""
    model = ctx.model
    if not isinstance(model, TransformerSpec):
        return 0.0
    itemsize, _ = _itemsizes(model)
    local = float(ctx.tokens * model.kv_heads * (model.qk_head_dim + model.value_head_dim))
    return local * itemsize / ctx.width_shards


def context_traffic(ctx: MeshContext, axis: str) -> Iterator[Traffic]:
    """A context axis: each attention layer gathers the sequence's keys and values
    (``all_gather``; their gradients reduce-scattered in the backward pass, gathered
    again where remat recomputes attention) or passes them round the ring
    (``send-recv``, ``context - 1`` shards each way). The weights as fsdp."""
    yield from gathered_param_traffic(ctx, axis)
    model = ctx.model
    if not isinstance(model, TransformerSpec):
        return
    n, local_kv = ctx.axes[axis], _local_kv_bytes(ctx)
    layers = model.layers // ctx.layer_shards
    if ctx.options.context.strategy == "ring":
        yield Traffic("send-recv", "forward", "keys and values", local_kv * (n - 1), layers)
        yield Traffic("send-recv", "backward", "keys and values", 2 * local_kv * (n - 1), layers)
        return
    yield Traffic("all-gather", "forward", "keys and values", local_kv * n, layers)
    yield Traffic("reduce-scatter", "backward", "keys and values", local_kv * n, layers)
    if recompute_flops_per_token(model)[1] > 0:  # recomputed attention gathers again
        yield Traffic("all-gather", "backward", "keys and values", local_kv * n, layers)


def context_kv_bytes(ctx: MeshContext) -> Mapping[str, float]:
    """``context_kv``: the keys and values a context-parallel attention layer holds
    beside its own: ``all_gather`` gathers the whole sequence's (``context`` times this
    device's) and its backward pass makes their gradient whole before the
    reduce-scatter, so two such arrays; ``ring`` holds the shard being computed on and
    the next one arriving, two of this device's size. Split by the width axes, as the
    heads are."""
    cp = ctx.sequence_shards
    if cp <= 1:
        return {"context_kv": 0.0}
    gathered = cp if ctx.options.context.strategy == "all_gather" else 1
    return {"context_kv": 2 * _local_kv_bytes(ctx) * gathered}


def stage_pass_bytes(ctx: MeshContext) -> Mapping[str, float]:
    """``stage_pass``: a pipeline stage's pass in the backward pass. The loop's iteration
    runs its ``layers_per_stage`` layers on one microbatch as a scan, whose backward pass
    holds their saved inputs stacked, and the stack of their input gradients: two copies
    of ``layers_per_stage`` layer inputs of one microbatch (the ``d``-wide residual
    stream, split over the width axes). XLA's HBM allocation of the pipelined runs of
    ``benchmarks/production_memory.py`` has them beside the loop's saved activations."""
    shape, model = ctx.pipeline, ctx.model
    if shape is None or not isinstance(model, TransformerSpec):
        return {"stage_pass": 0.0}
    itemsize, _ = _itemsizes(model)
    per_token = model.d_model / ctx.width_shards * itemsize
    return {
        "stage_pass": float(
            int(2 * shape.layers_per_stage * ctx.tokens / shape.microbatches * per_token)
        )
    }
