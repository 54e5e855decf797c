"""What MaxText's training step holds that the library's does not: the terms a hardware
plan's memory estimate (``program="maxtext"``, DESIGN v1.4 "The program users launch")
prices beside :mod:`datarax.estimate.memory`'s, read off MaxText 0.2.5's compiled steps
(``benchmarks/maxtext_memory.py``; BENCHMARKS.md, "Memory against MaxText's compiled
program").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from datarax.parallel.context import MeshContext
from datarax.parallel.terms import repeat_per_device
from datarax.specs.model_specs import TransformerSpec

__all__ = [
    "MAXTEXT_SCAN_BLOCK",
    "maxtext_pipeline_gathered",
    "maxtext_program_context",
    "maxtext_moe_layers_per_block",
    "maxtext_scan_block",
    "maxtext_scan_copies",
    "maxtext_temporaries",
]


def maxtext_program_context(ctx: MeshContext) -> MeshContext:
    """``ctx`` as MaxText's program runs it (``program="maxtext"``, the hardware plans'
    figure; DESIGN v1.4 "The program users launch"), where it differs from the library's:

    - ``remat: none`` is full rematerialization: MaxText 0.2.5's decoder
      (``layers/nnx_decoders.py``, ``_apply_layers_sequentially``) wraps each scanned
      layer in ``jax.checkpoint`` with ``get_remat_policy()``, which is ``None`` (JAX's
      save-nothing policy) for ``remat_policy=none`` as for ``full``: the compiled steps
      of Llama 2 7B on a v5e-4 at ``none`` and ``full`` allocate the same 16,597,957,632
      bytes (``benchmarks/maxtext_memory.py``).
    """
    model = ctx.model
    if isinstance(model, TransformerSpec) and model.remat == "none":
        return dataclasses.replace(ctx, model=dataclasses.replace(model, remat="full"))
    return ctx


def maxtext_temporaries(
    ctx: MeshContext, parts: Mapping[str, int], itemsize: int
) -> dict[str, int]:
    """The temporaries of MaxText's program at its peak, from the library's (``parts``,
    :func:`_temporaries`); a pipelined transformer adds its stage's gathered weights
    (:func:`maxtext_pipeline_gathered`) and nothing else; an unpipelined one:

    - the layer-major copies of the scanned MLP and expert kernels
      (:func:`maxtext_scan_copies`), in place of the library's float32 expert kernels'
      cast (``expert_cast``: the cast is made in the copy);
    - a dense model: no layer's weights gathered: the peak is at the loss, before the
      backward loop starts, where the forward loop's gathers are freed and the backward
      loop's not yet made (XLA's live ranges of Llama 2 7B on a v5e-4);
    - a mixture of experts: one scanned block's expert kernels (those of its MoE layers,
      :func:`maxtext_moe_layers_per_block`) gathered whole over the
      fsdp axes (``all-gather``/``async-collective-done`` of three
      ``bf16[8, 4096, 14336]``-sized buffers at the peak of a 4-layer Mixtral on a v5e-8,
      dropless and capacity kernels alike; a block is one layer but for the models of
      :data:`MAXTEXT_SCAN_BLOCK`), once, where the library's dropless kernel holds them and
      their gradient.

    Evidence: ``benchmarks/maxtext_memory.py`` (BENCHMARKS.md)."""
    model = ctx.model
    if not isinstance(model, TransformerSpec):
        return dict(parts)
    if ctx.pipeline is not None:
        return {**parts, "pipeline_gathered": maxtext_pipeline_gathered(ctx, itemsize)}
    out = {k: v for k, v in parts.items() if k != "expert_cast"}
    out["scan_layout_copies"] = maxtext_scan_copies(ctx, itemsize)
    experts = sum(
        math.prod(shard) * ctx.gathered_by(group) * itemsize
        for group, _, shard, split in ctx.specs
        if group.expert and split and ctx.gathered_by(group) > 1
    )
    out["fsdp_gathered"] = experts * maxtext_moe_layers_per_block(model) if model.is_moe else 0
    return out


MAXTEXT_SCAN_BLOCK: dict[str, int] = {
    "gpt-oss-120b": 2,
    "llama4-17b-16e": 4,
    "llama4-17b-128e": 4,
}
"""The named models MaxText scans in blocks of several layers
(``inhomogeneous_layer_cycle_interval`` of ``configs/models/<name>.yml`` at MaxText
0.2.5: the layers whose pattern repeats, e.g. Llama 4's three RoPE layers and one
without); every other model is scanned a layer at a time (base.yml: 1)."""


def maxtext_scan_block(model: TransformerSpec) -> int:
    """Layers in one scanned block of MaxText's decoder for ``model``: its gathered
    weights are made a block at a time. At the peak of Llama 4 Scout's compiled step
    (v5p-128, fsdp 64) XLA holds four layers' expert kernels gathered over fsdp (twelve
    ``bf16[1, 16, 5120, 8192]``-sized buffers, 15 GiB) where a model scanned a layer at
    a time holds one layer's (Mixtral cut to 4 layers: three); the estimate without the
    block was -26.2% of XLA's allocation, +2.0% with it."""
    return MAXTEXT_SCAN_BLOCK.get(getattr(model, "name", None) or "", 1)


def maxtext_moe_layers_per_block(model: TransformerSpec) -> int:
    """The mixture-of-experts layers of one scanned block (:func:`maxtext_scan_block`):
    one in ``moe_every`` of its layers (Llama 4 Maverick: 2 of a block of 4)."""
    return max(1, maxtext_scan_block(model) // (model.moe_every or 1))


def maxtext_scan_copies(ctx: MeshContext, itemsize: int) -> int:
    """Bytes of the layer-major copies of the scanned MLP and expert kernels in MaxText's
    program.

    MaxText stores a scanned layer's kernels with the layer axis second
    (``param_scan_axis: 1`` in ``configs/base.yml``: ``[embed, layers, mlp]``); its scan
    slices them layer by layer along the first axis, so XLA copies each device's shard of
    every layer's dense MLP kernels (gate, up, down) to ``[layers, ...]`` once, before the
    forward loop, and keeps the copies through the backward loop, beside the arguments,
    the gradients' accumulators and the saved layer inputs (the step's peak, at the start
    of the backward loop: ``copy.401``-``copy.403``, three ``bf16[32, 1024, 11008]`` of
    Llama 2 7B on a v5e-4, libtpu 0.0.50.1, ``--xla_dump_to``'s live ranges; the expert
    kernels likewise, ``copy.552``-``554`` of a 4-layer Mixtral on a v5e-8), in the
    compute dtype (``itemsize``: float32 weights are cast in the copy; priced in float32
    the two float32 rows' out-of-memory figures, 28.88G and 33.44G, came out +4% and
    +10%, in the compute dtype -3% and +2%). The attention kernels are sliced in place.
    Not priced for pipelined plans (MaxText's pipeline stacks its stages' layers
    otherwise; not measured)."""
    if ctx.pipeline is not None or not isinstance(ctx.model, TransformerSpec):
        return 0
    return sum(
        math.prod(shard) * repeat_per_device(group, ctx.layer_shards) * itemsize
        for group, _, shard, _ in ctx.specs
        if "*" in group.path and ("/mlp/" in group.path or group.expert)
    )


def maxtext_pipeline_gathered(ctx: MeshContext, itemsize: int) -> int:
    """Bytes of a pipeline stage's layer weights gathered whole over the fsdp axes in
    MaxText's pipelined program.

    MaxText 0.2.5's pipeline (``layers/pipeline.py``, ``NNXPipeline``) runs its stages'
    layers inside a ``scan`` over the pipeline iterations with the stage weights a loop
    constant; the fsdp all-gathers of those weights do not depend on the iteration, and
    the compiled step holds every layer of the stage gathered at once (in the compute
    dtype, ``itemsize``) rather than one layer at a time. Read off two compiles of
    Llama 2 7B on a v5e-8 (bf16 weights, full remat, GPipe): 2 stages x fsdp 4 allocate
    14.39 GiB where the library's terms price 8.46 (a stage's gathered weights: 6.04
    GiB), 4 stages x fsdp 2 11.95 GiB where they price 8.82 (3.02 GiB);
    ``benchmarks/maxtext_memory.py``."""
    return sum(
        math.prod(shard) * ctx.gathered_by(group) * repeat_per_device(group, ctx.layer_shards)
        * itemsize
        for group, _, shard, _ in ctx.specs
        if "*" in group.path
    )  # fmt: skip
