"""Per-device memory of one training step, at its peak, priced on the catalog's hardware.

The state (parameters, gradients, optimizer moments, sharded by role), the batch slice,
the activations the compiled step keeps for its backward pass (JAX's autodiff residuals of
:mod:`datarax.spmd.compile_step`'s step, float32 copies included) and the
temporaries live at the peak: the largest FSDP parameter gathered whole, for the
transformer the larger of the loss's and the last layer's backward pass's transients (they
never coexist), for the MLP the widest hidden layer's activation gradient. On TPU
(``vmem_bytes``), a working set that fits in one TensorCore's VMEM is taken off HBM, which
then holds the arguments and little more. Compared case by case with XLA's HBM figure in
``benchmarks/compile_checks.py``. Plain arithmetic; nothing touches a device.


How :func:`memory_estimate` counts each part
--------------------------------------------

``params``, ``grads`` and ``optimizer`` (moments, ``OPTIMIZER_STATE_FACTOR`` times the
parameters) are held in the parameters' dtype (``param_dtype``, MaxText's
``weight_dtype``; optax keeps moments in the parameters' dtype) and sharded as
:func:`param_specs` says; ``batch`` is this device's slice of
inputs and targets. ``activations`` are what the compiled step
(:mod:`datarax.spmd.compile_step`) keeps for its backward pass for this
device's tokens: JAX's autodiff residuals of that step as XLA materializes them
(:func:`_transformer_residuals`, :func:`_mlp_residuals`; not the textbook
``ModelSpec.activation_elements_per_token``, which leaves out float32 copies, masks
and elementwise intermediates the step's autodiff saves).

``temporaries`` are the buffers XLA allocates beside those at the step's peak:

- FSDP parameters gathered in flight: an fsdp-split parameter is all-gathered whole
  (its tensor shard) where it is used, in the forward and again in the backward pass,
  and its gradient exists whole before the reduce-scatter. XLA's TPU scheduler
  (latency-hiding, memory-pressure aware) places each gather next to its use and
  frees the gathered copy after its last use in that pass, and the backward pass
  makes the input gradient (which needs the gathered parameter) before the weight
  gradient (whole, then reduce-scattered), so one whole parameter is live at a time:
  the largest gathered group is counted (a transformer's per-layer group is one
  stacked ``[layers, ...]`` array that the scan takes whole). Small parameters are
  prefetched further ahead (compiles show up to 3 gathered weights of 8-32 MiB
  live); that is not modelled.
- The transformer's phase transient: the peak is the larger of two moments whose
  transients never coexist (XLA frees the loss's buffers before the layers' backward
  pass starts). At the loss, all saved activations are live and the logits exist in
  the model dtype (``b vocab / tensor`` per token) beside the saved float32
  ``exp(logits)``. In the last layer's backward pass the head's residuals are gone
  and one float32 array of the layer's attention scores is made (their gradient,
  ``4 heads S / tensor``); under ``remat: full`` that layer is first recomputed: its
  textbook activations (``activation_elements_per_token`` of one layer: XLA fuses the
  recomputation into the backward pass, so the float32 norm copies and elementwise
  intermediates are not materialized) and softmax's float32 output, which the
  scores' gradient then replaces. Evidence: the live buffers at the peak of XLA's
  buffer assignment (``--xla_dump_to``, ``*-live-range.txt``) for the transformer
  cases of ``benchmarks/compile_checks.py``.
- Mixture-of-experts layers: float32 expert kernels cast to the compute dtype once
  (each device's shard of every layer's experts, held through both passes), and a
  recomputed capacity-kernel layer's three hidden ``[E, B, C, moe_d_ff]`` arrays in
  place of the six autodiff saves at ``remat: none`` (:func:`_moe_bytes`).
- The MLP's backward transient: the widest hidden layer's activation gradient
  (``b width / tensor`` per token for a ``col`` layer's output), live beside the
  residuals. It is a matmul's output (the next layer's input gradient, masked by
  ReLU) read by two matmuls (the weight and the input gradient), so XLA cannot
  fuse it away; the loss's gradient, by contrast, is an elementwise function of the
  output and the targets that XLA fuses into its consumers, and is not counted.

On-chip VMEM (``vmem_bytes``, the catalog's ``Hardware.vmem_bytes``; ``None``: not
modelled). On TPU, XLA's memory-space assignment moves buffers the step makes into
the TensorCore's VMEM, where they take no HBM. The rule: when the whole working set
(``grads + activations + temporaries``, the buffers the step makes beside its
arguments) fits in one TensorCore's VMEM, all of it is taken to sit there, and HBM
holds the arguments (parameters, optimizer state, batch) and
:data:`_HBM_REMAINDER` (constants, scalars, the asynchronous copies' handles and
the temporary heap's slack: 0.7-1.4 MiB in every such compile), plus, where a
``dcn_axes`` axis reduces the gradients (a data or fsdp axis across slices),
the gradients and one received copy of them: DCN transfers go through the host's
NIC, which reads and writes HBM, not VMEM. Those bytes are reported in HBM terms:
``grads`` (DCN only), ``activations`` 0, ``temporaries`` the received copy and the
remainder; ``vmem`` is the working set taken off HBM. Limits: memory-space
assignment is a heuristic that also weighs each buffer's size and benefit, so a
working set that fits may still stay in HBM (the estimate is then low), and one that
does not fit still goes partly to VMEM (not modelled: the estimate is then high; a
161 MiB working set on v5e keeps only ~81 MiB in HBM). VMEM is per TensorCore: on
v4/v5p megacore chips the step's working set is compared with one core's VMEM.

The transposed update (``update_layout_copies``, the catalog's
``Hardware.update_layout_copies``: v6e). There XLA's layout assignment runs the
optimizer update of an MLP's first kernel in the transposed layout: it copies the
kernel's shard and each optimizer moment (Adam: two) to that layout, updates them
and copies the results back. The update is then a second candidate for the peak:
the arguments, the first kernel's gradient (the last one the backward pass makes;
the other layers' updates have run and freed theirs) and the copies. Where that
would pass :data:`_REMAT_FRACTION` of the chip's HBM, XLA's rematerialization keeps
one copy fewer (Adam; SGD's one copy stays). Where the gradient and the copies fit
one TensorCore's VMEM they are placed there and add no HBM. When this moment is the
larger, the figures describe it: ``grads`` the first kernel's gradient,
``activations`` 0, ``temporaries`` the copies (also ``layout_copies``) and, under
fsdp, the whole gradient. Evidence:
the live buffers of 83 compiled steps, 81 MLPs (v6e: every data-parallel and
tensor-parallel one has the copies; within 10% of XLA in 55 of 68 v6e steps against
16 without the rule; v5e and v5p: none; the transformer's stacked layers: none;
``benchmarks/compile_checks.py``). What it misses: XLA may schedule the copies
early, beside the backward pass's FSDP-gathered kernels of a multi-layer step (v6e
fsdp 8: -17% to -20%), may not keep a multi-layer FSDP step's whole gradient beside
them (+13%, +22%), and may keep another layer's gradient until the first kernel's
update (v6e ``[16384, 8192, 16384]``: -9%).

Stages, context and ZeRO-1 (:class:`~datarax.parallel.options.ParallelOptions`). Stages
hold their layers' state (:func:`~datarax.parallel.axis_roles.repeat_per_device`) and
their schedule's activations in flight (:func:`_pipeline_shares`); a context axis divides
the tokens a device keeps and adds the keys and values it gathers
(:func:`datarax.parallel.terms.context_kv_bytes`); ``shard_over_data`` splits the
optimizer state over the data axes as well (MaxText's ``shard_optimizer_over_data``
adds them to the optimizer state's sharding only: parameters and gradients keep theirs).

The figure is meant for HBM: ``fits`` compares it with the HBM a program may use
(``usable_hbm_bytes``, else ``hbm_bytes``), as XLA's compile-time OOM check compares
its HBM allocation (``total_allocation_bytes``, ``compile_step``'s
``hbm_peak_bytes``) with the HBM it makes available, a little under the chip's.
Left out: the extra hidden-sized buffers of the collective-matmul loops XLA may use
for an FSDP matmul; see ``benchmarks/compile_checks.py`` for where they show.

Example:
  >>> mem = memory_estimate({"kind": "mlp", "features": [1024, 4096, 1024]},
  ...                       {"data": 2, "fsdp": 4}, global_batch=64)
  >>> mem["params"] == mem["grads"], mem["fits"]
  (True, None)
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from datarax.errors import PlanError
from datarax.estimate.maxtext_memory import maxtext_program_context, maxtext_temporaries
from datarax.estimate.results import HardwareMemory, MemoryEstimate
from datarax.hardware.chips import Hardware
from datarax.parallel.axis_roles import ParamSharding
from datarax.parallel.context import MeshContext, mesh_context
from datarax.parallel.options import ParallelOptions
from datarax.parallel.terms import repeat_per_device
from datarax.plan.memory import OPTIMIZER_STATE_FACTOR
from datarax.specs.model_specs import (
    DTYPE_BYTES,
    MLPSpec,
    ModelSpec,
    TransformerSpec,
    model_spec,
)

__all__ = ["hardware_memory", "memory_estimate"]

_F32 = 4
_IN_FLIGHT_GATHERS = 1
_SCAN_IN_FLIGHT_GATHERS = 2
_HBM_REMAINDER = 2**20
"""Bytes HBM holds beside the arguments when a step's working set sits in VMEM (see
:func:`memory_estimate`): XLA's HBM figure less the arguments was 0.7-1.4 MiB for every
such step of ``benchmarks/compile_checks.py`` (v5e and v6e, 8 to 256 chips)."""
_REMAT_FRACTION = 0.9
"""Share of the chip's HBM above which XLA's rematerialization takes one of the transposed
update's copies off the peak (see :func:`memory_estimate`): on v6e (32 GiB) an Adam step
whose update with three copies came to 28.74 GiB kept them, one that came to 28.78 GiB
(``[46976, 46976]``, data 8) and every larger one kept two (``copy.remat2``)."""


def _mlp_residuals(model: MLPSpec, t: int, itemsize: int) -> float:
    """Bytes per example the compiled MLP step keeps for its backward pass: JAX's
    autodiff residuals (``jax.ad_checkpoint.print_saved_residuals`` of the step's loss)
    as XLA materializes them. Kept: the input cast to the model dtype (``b in``), each
    hidden layer's ReLU output (model dtype) and ReLU's mask (one byte per element), and
    the output (``b out``); a ``col`` layer's output is split over the ``tensor`` axes.
    The loss's float32 residual (``2 (out - targets)``) is not: XLA fuses it into the
    loss's backward pass, recomputed from the output and the targets (an argument).
    ``full``: the input and the output (the hidden layers are recomputed)."""
    widths = model.features
    split = [t if i % 2 == 0 else 1 for i in range(len(widths) - 1)]
    ends = itemsize * (widths[0] + widths[-1] / split[-1])
    if model.remat == "full":
        return ends
    hidden = sum((itemsize + 1) * w / k for w, k in zip(widths[1:-1], split[:-1], strict=True))
    return ends + hidden


def _transformer_head(model: TransformerSpec, t: int, itemsize: int) -> float:
    """Bytes per token the step keeps for the backward pass of its head (see
    :func:`_transformer_residuals`): the final norm, like each layer's
    (``(2 * 4 d + 2 b d) / t``), the loss's float32 log-sum-exp and the int32 target
    index it gathers with (``datarax.models``' cross-entropy is a custom VJP that
    recomputes the logits in its backward pass, as MaxText's does, so no logits are
    kept, tiled or not)."""
    d = model.d_model
    return (2 * _F32 * d + 2 * itemsize * d) / t + _F32 + 4


def _layer_none_bytes(
    model: TransformerSpec,
    t: int,
    b: int,
    *,
    moe: bool = False,
    e: int = 1,
    recomputed: bool = False,
    routed: bool = False,
) -> float:
    """Bytes per token one layer keeps under ``remat: none`` (see
    :func:`_transformer_residuals`); ``moe``: a mixture-of-experts layer with ``e``-way
    expert parallelism (:func:`_moe_bytes`); ``recomputed``: the layer recomputed in the
    backward pass of a remat policy (:func:`_moe_bytes`); ``routed``: Megatron's dispatch."""
    d, h, s = model.d_model, model.heads, model.seq_len
    qk, v, kv = model.qk_head_dim, model.value_head_dim, model.kv_heads
    mlp = 6 if model.mlp == "gated" else 5
    norms = 2 * (2 * _F32 * d + 2 * b * d)
    if model.attention == "dot":  # softmax's float32 output, its two statistics, probs
        attention = b * (h * qk + h * v + kv * (qk + v)) + (_F32 + b) * h * s + 2 * _F32 * h
    else:  # the kernel's output (and its [S, heads * hd] view) and float32 log-sum-exp
        attention = b * (h * qk + 2 * h * v + kv * (qk + v)) + _F32 * h
    ffn = _moe_bytes(model, b, e, recomputed, routed) if moe else mlp * b * model.d_ff
    return (norms + attention + ffn) / t


def dispatch_factor(model: TransformerSpec, e: int, routed: bool = False) -> float:
    """Rows each routed token takes in an expert's buffers, per token and expert it goes
    to. Dropless (``capacity_factor`` 0 or less) over ``e > 1`` expert shards, MaxText
    sizes the all-to-all's receive buffer for the worst case, every token of the expert
    group routed to one shard: ``min(e, num_experts / experts_per_token)`` times the
    balanced size (``RoutedMoE.get_ragged_buffer_size`` in MaxText's ``layers/moe.py``
    at commit ``e591f30cbbf217ed67ef71263ec0538239f9c3b8``), and the grouped matmuls run
    over that buffer. Dropless on one shard: 1 (the tokens sorted by expert). With a
    capacity: ``capacity_factor`` (each expert padded or cut to its share times it).

    ``routed``: as Megatron's ``MoEAlltoAllTokenDispatcher`` sizes them (PyTorch profiles):
    the tokens routed, ``k`` a token (the all-to-all's output, sized by the routing's
    counts), no worst-case buffer; with a capacity, the capacity."""
    if not model.dropless:
        return model.capacity_factor
    if e <= 1 or routed:
        return 1.0
    return min(float(e), model.num_experts / model.experts_per_token)


def _moe_bytes(
    model: TransformerSpec, b: int, e: int, recomputed: bool = False, routed: bool = False
) -> float:
    """Bytes per token a mixture-of-experts layer's feed-forward part keeps under
    ``remat: none``, before the tensor split: the router's float32 logits and
    probabilities (``2 * 4 E``); the dispatched copies of the token (``k w d``, ``w``
    the :func:`dispatch_factor`), the experts' hidden arrays (as a dense MLP's: six or
    five per hidden unit, ``k w moe_d_ff`` wide) and their outputs before the combine
    (``k w d``), the combined ``k d`` rows; the shared experts as a dense MLP
    ``shared_experts * moe_d_ff`` wide.

    ``recomputed``: the layer as a remat policy recomputes it inside its backward pass.
    There the capacity kernel's experts hold three ``[E, B, C, moe_d_ff]`` arrays at
    once (gated; two plain), not the six autodiff saves: XLA fuses the activation into
    the backward pass, which holds the product and the two input projections'
    gradients (``fusion.748`` and ``fusion.749{0,1}`` at the peak of XLA's live ranges
    for tpu-recipes' Mixtral 8x7B on a v6e-256, 12 sequences a chip, libtpu 0.0.50.1;
    two at one sequence a chip on a v6e-64)."""
    d, f, k = model.d_model, model.moe_d_ff, model.experts_per_token
    w = dispatch_factor(model, e, routed)
    mlp = 6 if model.mlp == "gated" else 5
    if recomputed and model.moe_kernel != "sparse":
        mlp = 3 if model.mlp == "gated" else 2
    router = 2 * _F32 * model.num_experts
    # dispatched rows a routed copy takes at once: its copy into the expert's buffer and
    # the expert's output (2); over expert shards the kernel's buffers of each way of the
    # all-to-all (sent, received, sorted by expert, output, sent back, received back: 6)
    copies = 6 if e > 1 and model.dropless and model.moe_kernel == "sparse" else 2
    experts = b * (copies * k * w * d + k * d) + mlp * b * k * w * f
    shared = mlp * b * model.shared_experts * f
    return router + experts + shared


def _none_bytes_by_layer(
    model: TransformerSpec, t: int, b: int, e: int, recomputed: bool = False, routed: bool = False
) -> list[tuple[int, float]]:
    """``[(layers, bytes per token of one at remat none)]``: the dense layers and the
    mixture-of-experts layers (``recomputed``: see :func:`_moe_bytes`)."""
    out = [(model.dense_layers, _layer_none_bytes(model, t, b))]
    if model.moe_layers:
        moe = _layer_none_bytes(model, t, b, moe=True, e=e, recomputed=recomputed, routed=routed)
        out.append((model.moe_layers, moe))
    return [(n, per) for n, per in out if n]


def _named_bytes(model: TransformerSpec, t: int, b: int, place: str) -> float:
    """Bytes per token and layer of MaxText's named tensors that the policy puts at
    ``place`` (``device`` or ``offload``)."""
    places = model.remat_places() or {}
    sizes = model.named_elements_per_token(t)
    return b * sum(sizes[name] for name, where in places.items() if where == place)


def _transformer_residuals(
    model: TransformerSpec,
    t: int,
    itemsize: int,
    e: int = 1,
    layer_share: float = 1.0,
    head_share: float = 1.0,
    routed: bool = False,
) -> float:
    """Bytes per token that JAX's autodiff of the compiled step keeps in HBM for the
    backward pass (``jax.ad_checkpoint.print_saved_residuals`` of the step's loss lists
    these, and XLA's forward ``while`` loop stacks them ``[layers, ...]``).

    ``none``, per layer (``b`` the compute dtype's bytes, ``t`` the tensor size, which
    splits every activation, the residual stream included): each RMS norm keeps its input
    cast to float32 and the normalized float32 input (``2 * 4d``) and two ``d``-wide
    compute-dtype arrays (the normalized input cast back, the scaled output: ``2bd``);
    attention keeps ``q``, ``k``, ``v`` (``k``/``v`` at ``kv_heads``) and, with a
    ``flash`` kernel, its output twice (the kernel's and its ``[S, heads * hd]`` view) and
    its float32 log-sum-exp per head, with ``dot`` attention the output once, softmax's
    float32 output (``4 heads S``), its two float32 statistics and the probabilities
    (``b heads S``); the MLP keeps six (gated) or five (plain) ``d_ff``-wide arrays. Once,
    the head (:func:`_transformer_head`). Any other policy keeps only the named tensors it
    places on the device (:meth:`TransformerSpec.remat_places`: ``full`` only the layer
    input, ``b d``); offloaded ones are in :func:`_offloaded_bytes`. Checked against
    ``print_saved_residuals`` of ``datarax.models``' step for every policy
    (``tests/datarax/spmd/test_compile_step.py``).

    Pipelined (:func:`_pipeline_shares`), a device keeps ``layer_share`` of the layers'
    bytes per token (its stage's layers, for the microbatches in flight) and
    ``head_share`` of the head's (the head runs outside the pipeline, its batch split
    over the stages, as MaxText's logical rules split it).
    """
    head = _transformer_head(model, t, itemsize) * head_share
    if model.remat_places() is None:
        by_layer = _none_bytes_by_layer(model, t, itemsize, e, routed=routed)
        layers = sum(n * per for n, per in by_layer)
    else:
        layers = model.layers * _named_bytes(model, t, itemsize, "device")
    return layers * layer_share + head


def _offloaded_bytes(model: ModelSpec, t: int, itemsize: int) -> float:
    """Bytes per token the policy moves to host memory (all layers)."""
    if not isinstance(model, TransformerSpec):
        return 0.0
    return model.layers * _named_bytes(model, t, itemsize, "offload")


def _temporaries(
    model: ModelSpec,
    specs: Sequence[ParamSharding],
    t: int,
    e: int,
    gathered_by: Mapping[str, int],
    tokens: int,
    itemsize: int,
    param_itemsize: int,
    shares: tuple[float, float, float] = (1.0, 1.0, 1.0),
    routed: bool = False,
) -> dict[str, int]:
    """What XLA holds beside the state and the saved activations at the step's peak
    (see :func:`memory_estimate`): ``fsdp_gathered`` and the ``phase`` transient (the
    transformer's loss or last-layer backward transient; the MLP's widest hidden
    activation gradient). ``gathered_by``: ``{group path: devices its fsdp-like axes
    split it over}`` (:func:`~datarax.parallel.axis_roles.gather_axes`). ``shares``:
    ``(layers, head, one layer's pass)``, the shares of ``tokens`` whose activations a
    pipelined device keeps, whose head it runs, and that one layer's backward pass runs
    at a time (a microbatch) (:func:`_pipeline_shares`). ``t``: the width shards
    (tensor x sequence), which split every activation; ``e``: the expert shards. The
    kinds' own transient parts (a context axis's gathered keys and values, a pipeline
    stage's pass) are their registry terms (:meth:`MeshContext.kind_memory`)."""
    # The scanned transformer gathers one layer's slice of a stacked parameter inside the
    # loop (the layer's weights, cast to the compute dtype), and XLA's scheduler
    # prefetches the next layer's: two in flight. The embedding and unembedding are
    # gathered at the loop's edges (the lookup, the loss) and are not live at the peak
    # (XLA's HBM allocation of benchmarks/production_memory.py's runs: counting them put
    # the 128k-vocabulary runs 7-30% high). The MLP gathers whole parameters.
    scanned = isinstance(model, TransformerSpec)
    gathered = sorted(
        (math.prod(shard) * gathered_by[group.path]
         * (itemsize if scanned else group.repeat * param_itemsize)
         for group, _, shard, split in specs
         if split and gathered_by[group.path] > 1 and (not scanned or "*" in group.path)),
        reverse=True,
    )  # fmt: skip
    in_flight = _SCAN_IN_FLIGHT_GATHERS if scanned else _IN_FLIGHT_GATHERS
    out = {"fsdp_gathered": sum(gathered[:in_flight]), "phase": 0}
    if isinstance(model, TransformerSpec) and model.is_moe and model.moe_kernel == "sparse":
        # the dropless kernel gathers all of a layer's expert kernels at once inside its
        # shard_map, and their gradient exists whole before the reduce-scatter
        experts = sum(math.prod(shard) * gathered_by[group.path] * itemsize
                      for group, _, shard, split in specs if group.expert and split)  # fmt: skip
        out["fsdp_gathered"] = max(out["fsdp_gathered"], 2 * experts)
    if isinstance(model, TransformerSpec) and model.is_moe and param_itemsize != itemsize:
        # XLA casts each device's shard of the stacked expert kernels to the compute
        # dtype once, before the layers' loop, and keeps the copy through both passes
        # (``convert`` of ``[layers, experts, ...]`` shards live at the peak of the
        # capacity and the dropless kernels' Mixtral 8x7B compiles, libtpu 0.0.50.1)
        out["expert_cast"] = sum(math.prod(shard) * group.repeat * itemsize
                                 for group, _, shard, _ in specs if group.expert)  # fmt: skip
    if isinstance(model, MLPSpec):
        # The backward pass makes each hidden layer's activation gradient (the next
        # layer's input gradient, masked by ReLU's mask) in the model dtype. It is a
        # matmul's output consumed by two matmuls (the layer's weight gradient and its
        # input gradient), so XLA materializes it; the widest one is counted.
        widths = model.features
        hidden = [w / (t if i % 2 == 0 else 1) for i, w in enumerate(widths[1:-1])]
        out["phase"] = int(tokens * itemsize * max(hidden, default=0))
    if isinstance(model, TransformerSpec):
        # The step's peak is the larger of two moments whose transients never coexist.
        # At the loss, every saved activation is live (``activations`` counts them) and
        # the loss's backward pass (a custom VJP) recomputes one vocabulary tile's logits
        # and writes their gradient, both in the compute dtype. In a layer's backward
        # pass the head's residuals are gone; under a remat policy the layer's forward
        # pass is first recomputed and keeps what autodiff keeps at remat none
        # (:func:`_layer_none_bytes`), beside its offloaded tensors copied back from host
        # memory; under remat none with dot attention, one float32 array of the scores'
        # size is made (their gradient). Evidence: XLA's HBM allocation of the runs of
        # benchmarks/production_memory.py (BENCHMARKS.md).
        h, s = model.heads // t, model.seq_len
        head = _transformer_head(model, t, itemsize)
        loss = 2 * itemsize * model.vocab / t / model.vocab_tiling
        if model.remat_places() is None:
            layer = _F32 * h * s if model.attention == "dot" else 0.0
        else:
            by_layer = _none_bytes_by_layer(model, t, itemsize, e, True, routed)
            layer = max(per for _, per in by_layer)
            layer += _named_bytes(model, t, itemsize, "offload")
        _, head_share, pass_share = shares
        out["phase"] = int(tokens * max(loss * head_share, layer * pass_share - head * head_share))
    return out


def _in_vmem(
    grads: int,
    activations: int,
    temporaries: int,
    ctx: MeshContext,
    dcn_axes: Collection[str],
) -> tuple[int, int, int, int]:
    """``(grads, vmem, activations, temporaries)`` in HBM terms when the working set sits
    in VMEM (module docstring): HBM keeps the gradients only where a DCN axis reduces
    them, and one received copy with :data:`_HBM_REMAINDER`."""
    batch_axes = ctx.axes_where(lambda kind: kind.splits_batch)
    reduced_over_dcn = any(a in batch_axes for a in dcn_axes)
    hbm_grads = grads if reduced_over_dcn else 0
    vmem = grads + activations + temporaries - hbm_grads
    return hbm_grads, vmem, 0, hbm_grads + _HBM_REMAINDER


def _activation_bytes(
    ctx: MeshContext, itemsize: int, shares: tuple[float, float, float], routed: bool = False
) -> int:
    """Bytes of the activations this device keeps for the backward pass: its tokens'
    residuals (:func:`_transformer_residuals`, :func:`_mlp_residuals`), a pipelined
    device's shares of them (:func:`_pipeline_shares`)."""
    model, t = ctx.model, ctx.width_shards
    if isinstance(model, TransformerSpec):
        per_token = _transformer_residuals(
            model, t, itemsize, ctx.expert_shards, shares[0], shares[1], routed
        )
        return int(per_token * ctx.tokens)
    return int(_mlp_residuals(model, t, itemsize) * ctx.tokens)


def _pipeline_shares(ctx: MeshContext) -> tuple[float, float, float]:
    """``(layers, head, one layer's pass)``: the shares of a device's tokens whose layer
    activations it keeps, whose head it runs and that one layer's backward pass takes at
    a time. Without stages, ``(1, 1, 1)``. With ``s`` stages of a pipeline whose
    schedule keeps ``in_flight`` of its ``M`` microbatches
    (:class:`~datarax.parallel.options.PipelineShape`): a stage keeps its ``1 / s`` of
    the layers for those microbatches, ``in_flight / s``; the head runs over the batch
    split over the stages, ``1 / s``; a layer's backward pass runs one microbatch,
    ``1 / M``."""
    shape = ctx.pipeline
    if shape is None:
        return 1.0, 1.0, 1.0
    s = shape.stages
    return shape.in_flight / s, 1.0 / s, 1.0 / shape.microbatches


def _transposed_update(
    specs: Sequence[ParamSharding],
    gathered_by: Mapping[str, int],
    itemsize: int,
    moments: int,
    arguments: int,
    hbm_bytes: int | None,
) -> tuple[int, int, int]:
    """``(gradient, whole, copies)`` bytes of an MLP's first-kernel update run in the
    transposed layout (see :func:`memory_estimate`): the kernel shard's gradient, under
    fsdp its whole gradient before the reduce-scatter (else 0), and the kernel's and its
    ``moments`` optimizer moments' copies, one fewer where the moment would pass
    :data:`_REMAT_FRACTION` of ``hbm_bytes`` and there are moments to spare."""
    _, _, shard, split = next(spec for spec in specs if spec[0].path == "layers/0/kernel")
    kernel = math.prod(shard) * itemsize
    whole = kernel * gathered_by["layers/0/kernel"] if split else 0
    copies = (1 + moments) * kernel
    over = hbm_bytes is not None and arguments + whole + kernel + copies > (
        _REMAT_FRACTION * hbm_bytes
    )
    if moments and over:
        copies -= kernel
    return kernel, whole, copies


def hardware_memory(hw: Hardware) -> HardwareMemory:
    """The catalog figures of ``hw`` that :func:`memory_estimate` takes, as its keyword
    arguments (``hbm_bytes``, ``vmem_bytes``, ``update_layout_copies``,
    ``usable_hbm_bytes``)."""
    return {
        "hbm_bytes": hw.hbm_bytes,
        "vmem_bytes": hw.vmem_bytes,
        "update_layout_copies": hw.update_layout_copies,
        "usable_hbm_bytes": hw.usable_hbm_bytes,
        "host_memory_bytes": (
            None if hw.host_memory_bytes is None else hw.host_memory_bytes // hw.devices_per_host
        ),
    }


def check_optimizer(optimizer: str) -> None:
    """Refuse an optimizer whose state the estimates do not know.

    Raises:
      PlanError: ``unknown_optimizer``.
    """
    if optimizer not in OPTIMIZER_STATE_FACTOR:
        raise PlanError(
            "unknown_optimizer",
            f"optimizer {optimizer!r} is not one of {sorted(OPTIMIZER_STATE_FACTOR)}",
        )


def memory_estimate(
    model: ModelSpec | Mapping[str, Any],
    axes: Mapping[str, int],
    global_batch: int,
    *,
    roles: Mapping[str, str] | None = None,
    optimizer: str = "adam",
    hbm_bytes: int | None = None,
    vmem_bytes: int | None = None,
    dcn_axes: Collection[str] = (),
    update_layout_copies: bool = False,
    usable_hbm_bytes: int | None = None,
    host_memory_bytes: int | None = None,
    specs: Sequence[ParamSharding] | None = None,
    options: ParallelOptions | None = None,
    dispatch: str = "maxtext",
    program: str = "datarax",
) -> MemoryEstimate:
    """Bytes per device of one training step, at its peak.

    How each part is counted, and the evidence: the module docstring.

    Args:
      vmem_bytes: one TensorCore's VMEM (TPU), or ``None`` to count the working set in
        HBM (GPU, CPU, or no hardware known).
      dcn_axes: mesh axes that cross the data-centre network (a plan's ``axes_detail``
        entries with ``dcn > 1``); used only with ``vmem_bytes``.
      update_layout_copies: count the transposed update's copies (above).
      usable_hbm_bytes: the HBM XLA lets one program allocate (the catalog's
        ``Hardware.usable_hbm_bytes``), for ``fits``; ``None``: ``hbm_bytes``.
      host_memory_bytes: this device's share of its host's DRAM (the catalog's
        ``host_memory_bytes / devices_per_host``), against which the activations a remat
        policy offloads (``host_offload_bytes``, MaxText's ``offload`` places: they leave
        HBM for ``pinned_host`` memory) are checked; ``None``: not checked.
      specs: :func:`param_specs` of ``model`` on ``axes`` under ``roles``, where the
        caller has them already (:func:`~datarax.estimate.cost.estimate_step`).
      options: the pipeline, context-parallel and ZeRO-1 options
        (:class:`~datarax.parallel.options.ParallelOptions`; module docstring).
      dispatch: ``maxtext`` (MaxText's dispatch buffers, a dropless kernel's worst case) or
        ``routed`` (Megatron's all-to-all dispatcher's; :func:`dispatch_factor`).
      program: the training step priced: ``datarax`` (the library's own, this module's
        terms) or ``maxtext`` (MaxText's, what a hardware plan's launch runs: its terms
        in :mod:`datarax.estimate.maxtext_memory`); the answer's ``program``.

    Returns:
      A :class:`~datarax.estimate.results.MemoryEstimate` of
      ``{"params", "optimizer", "grads", "activations", "batch", "temporaries", "total",
      "vmem", "layout_copies", "hbm_bytes", "usable_hbm_bytes", "host_offload_bytes",
      "host_memory_bytes", "fits"}`` (ints and a bool; ``fits`` also needs the offloaded
      bytes to fit ``host_memory_bytes``; ``hbm_bytes``/``fits`` are ``None`` without
      HBM, ``usable_hbm_bytes`` is ``hbm_bytes`` where not given); ``total`` is the sum
      of the first six, HBM bytes; ``vmem`` is the working set taken to sit in VMEM
      instead (0 unless the rule above applies); ``layout_copies`` the transposed
      update's copies counted in ``temporaries`` (0 unless that moment is the peak).
    """
    model = model_spec(model)
    check_optimizer(optimizer)
    ctx = mesh_context(
        model,
        axes,
        global_batch,
        roles=roles,
        options=options,
        specs=None if specs is None else tuple(specs),
    )
    return step_memory(
        ctx,
        optimizer=optimizer,
        hbm_bytes=hbm_bytes,
        vmem_bytes=vmem_bytes,
        dcn_axes=dcn_axes,
        update_layout_copies=update_layout_copies,
        usable_hbm_bytes=usable_hbm_bytes,
        host_memory_bytes=host_memory_bytes,
        dispatch=dispatch,
        program=program,
    )


def step_memory(
    ctx: MeshContext,
    *,
    optimizer: str = "adam",
    hbm_bytes: int | None = None,
    vmem_bytes: int | None = None,
    dcn_axes: Collection[str] = (),
    update_layout_copies: bool = False,
    usable_hbm_bytes: int | None = None,
    host_memory_bytes: int | None = None,
    dispatch: str = "maxtext",
    program: str = "datarax",
) -> MemoryEstimate:
    """:func:`memory_estimate` of a request's :class:`~datarax.parallel.context.MeshContext`
    (its keyword arguments as there).

    Raises:
      PlanError: ``unknown_optimizer``.
    """
    check_optimizer(optimizer)
    if program == "maxtext":
        ctx = maxtext_program_context(ctx)
    routed = dispatch == "routed"
    model, specs, tokens = ctx.model, ctx.specs, ctx.tokens
    t = ctx.width_shards
    shares = _pipeline_shares(ctx)
    itemsize = DTYPE_BYTES[model.dtype]
    param_itemsize = DTYPE_BYTES[getattr(model, "param_dtype", model.dtype)]
    params = sum(
        math.prod(shard) * repeat_per_device(group, ctx.layer_shards) * param_itemsize
        for group, _, shard, _ in specs
    )
    host_offload = int(_offloaded_bytes(model, t, itemsize) * tokens * shares[0])
    activations = _activation_bytes(ctx, itemsize, shares, routed)
    batch = ctx.local_batch * model.batch_bytes_per_example() // ctx.sequence_shards
    optimizer_bytes = params * OPTIMIZER_STATE_FACTOR[optimizer] // ctx.optimizer_shards
    gathered_by = {group.path: ctx.gathered_by(group) for group, _, _, _ in specs}
    parts = _temporaries(model, specs, t, ctx.expert_shards, gathered_by, tokens, itemsize,
                         param_itemsize, shares, routed)  # fmt: skip
    parts.update({name: int(value) for name, value in ctx.kind_memory().items()})
    if program == "maxtext":
        parts = maxtext_temporaries(ctx, parts, itemsize)
    temporaries = sum(parts.values())
    grads, vmem = params, 0
    if vmem_bytes is not None and grads + activations + temporaries <= vmem_bytes:
        grads, vmem, activations, temporaries = _in_vmem(
            grads, activations, temporaries, ctx, dcn_axes
        )
    total = params + grads + optimizer_bytes + activations + batch + temporaries
    usable = hbm_bytes if usable_hbm_bytes is None or hbm_bytes is None else usable_hbm_bytes
    host_fits = host_memory_bytes is None or host_offload <= host_memory_bytes
    layout_copies = 0
    if update_layout_copies and isinstance(model, MLPSpec):
        arguments = params + optimizer_bytes + batch
        kernel, whole, copies = _transposed_update(
            specs, gathered_by, itemsize, OPTIMIZER_STATE_FACTOR[optimizer], arguments, hbm_bytes
        )
        in_vmem = vmem_bytes is not None and kernel + copies <= vmem_bytes
        if not in_vmem and arguments + whole + kernel + copies > total:
            grads, activations, layout_copies = kernel, 0, copies
            temporaries, total = whole + copies, arguments + whole + kernel + copies
    return MemoryEstimate(
        params=params,
        optimizer=optimizer_bytes,
        grads=grads,
        activations=activations,
        batch=batch,
        temporaries=temporaries,
        total=total,
        vmem=vmem,
        layout_copies=layout_copies,
        hbm_bytes=hbm_bytes,
        usable_hbm_bytes=usable,
        host_offload_bytes=host_offload,
        host_memory_bytes=host_memory_bytes,
        fits=None if usable is None else total <= usable and host_fits,
        program="maxtext" if program == "maxtext" else "datarax",
    )
