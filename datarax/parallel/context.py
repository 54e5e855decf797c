"""The facts every part of a plan needs about one request, built once: a
:class:`MeshContext` of the model, the mesh's axes and their kinds, the options and the
batch, with the shard counts, axis groups, parameter shardings, tokens and pipeline shape
they give.

Memory (:mod:`datarax.estimate.memory`), step time and collectives
(:mod:`datarax.estimate.cost`, :mod:`datarax.estimate.step_time`) and the kinds' terms
(:mod:`datarax.parallel.terms`) take a context; none derives roles again. The context is
where the registry's entries (:data:`~datarax.parallel.kinds.KINDS`) are read: what each
kind splits decides which shard count its axes multiply into, so a new kind needs no
change here or in the estimates.

Plain arithmetic, no NumPy and no JAX: the HTTP process plans with it.

Example:
  >>> ctx = mesh_context(
  ...     {"kind": "transformer", "d_model": 512, "heads": 8, "layers": 4, "d_ff": 2048,
  ...      "kv_heads": 8, "vocab": 32000, "seq_len": 1024},
  ...     {"data": 2, "fsdp": 2, "tensor": 2, "sequence": 2}, global_batch=8)
  >>> ctx.batch_shards, ctx.width_shards, ctx.activation_sequence_shards, ctx.tokens
  (4, 4, 2, 2048)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from datarax.parallel.axis_roles import (
    ParamSharding,
    axis_roles,
    check_kinds_apply,
    check_tensor_split,
    gather_axes,
    param_specs,
    role_sizes,
    tokens_per_device,
)
from datarax.parallel.kinds import KINDS, ParallelismKind
from datarax.parallel.options import (
    ParallelOptions,
    PipelineShape,
    pipeline_shape,
    pipelined_layers,
)
from datarax.parallel.terms import Traffic, repeat_per_device
from datarax.specs.model_specs import (
    DTYPE_BYTES,
    MLPSpec,
    ModelSpec,
    ParamGroup,
    TransformerSpec,
    model_spec,
)

__all__ = ["MeshContext", "WholeParam", "mesh_context"]


@dataclass(frozen=True)
class WholeParam:
    """A parameter group that axes meant to split stay whole on, since their size divides
    none of the dimensions they split (:meth:`MeshContext.whole_params`).

    Attributes:
      path: the group's path (``moe_layers/*/moe/experts/wi_0``).
      shape: its shape.
      axes: the mesh axes that leave it whole, mesh order.
      size: their product (what would have had to divide).
      what: what ``size`` divides, in words (``none of its dimensions``, ``not its
        dimension 1 (4097)``).
      bytes_per_device: the bytes one device holds of it (its layers there included).
      extra_bytes: what staying whole costs a device: ``bytes_per_device`` less its
        share had ``size`` split it.
    """

    path: str
    shape: tuple[int, ...]
    axes: tuple[str, ...]
    size: int
    what: str
    bytes_per_device: int
    extra_bytes: int

    def warning(self) -> str:
        """The plan's ``warnings`` entry: the parameter, the axes and the bytes."""
        axes = " x ".join(self.axes)
        return (
            f"parameter {self.path} {list(self.shape)} stays whole on {axes}: {self.size} "
            f"divides {self.what}, so each device holds {_gib(self.bytes_per_device)} of "
            f"it, {_gib(self.extra_bytes)} more than if {axes} split it; use a size of "
            f"{axes} that divides it"
        )


def _gib(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


@dataclass(frozen=True)
class MeshContext:
    """One request's mesh, read once through the registry.

    Attributes:
      model: the model's description.
      axes: ``{axis: size}`` (ici times dcn), mesh order.
      roles: ``{axis: kind name}`` for every axis.
      options: the pipeline, context-parallel and ZeRO-1 options.
      global_batch: sequences (examples) a step takes over the whole mesh.
      sizes: ``{priced kind: product of its axes' sizes}``.
      batch_shards: how many shards the batch splits into (the kinds that split it).
      sequence_shards: how many shards each sequence splits into for compute (context).
      activation_sequence_shards: how many shards the residual stream splits into along
        the sequence between the width-split regions (sequence parallelism).
      width_shards: how many shards the heads, the MLP, the vocabulary and the
        activations split into (tensor x sequence: the kinds that split a parameter's
        tensor dimension).
      expert_shards: how many shards the routed experts split into.
      layer_shards: how many pipeline stages the layers split into.
      local_batch: sequences per batch shard.
      tokens: tokens one device computes on in a step.
      pipeline: the pipeline's shape, or ``None`` without stages.
      specs: every parameter group's sharding
        (:func:`~datarax.parallel.axis_roles.param_specs`).
    """

    model: ModelSpec
    axes: Mapping[str, int]
    roles: Mapping[str, str]
    options: ParallelOptions
    global_batch: int
    sizes: Mapping[str, int]
    batch_shards: int
    sequence_shards: int
    activation_sequence_shards: int
    width_shards: int
    expert_shards: int
    layer_shards: int
    local_batch: int
    tokens: int
    pipeline: PipelineShape | None
    specs: tuple[ParamSharding, ...] = field(repr=False)

    def kind(self, axis: str) -> ParallelismKind:
        """The registry's entry of ``axis``."""
        return KINDS[self.roles[axis]]

    def axes_where(self, wanted: Callable[[ParallelismKind], bool]) -> tuple[str, ...]:
        """The axes over 1 whose kind ``wanted`` accepts, mesh order."""
        return tuple(a for a, n in self.axes.items() if n > 1 and wanted(self.kind(a)))

    @functools.cached_property
    def replica_axes(self) -> tuple[str, ...]:
        """Axes that split the batch but no parameter (their gradients all-reduced)."""
        return self.axes_where(lambda k: k.splits_batch and k.param_split == "none")

    @functools.cached_property
    def _gathered(self) -> dict[str, tuple[str, ...]]:
        return {g.path: gather_axes(g, self.axes, self.roles) for g, _, _, _ in self.specs}

    def gather_axes(self, group: ParamGroup) -> tuple[str, ...]:
        """The axes that split ``group`` as fsdp does
        (:func:`~datarax.parallel.axis_roles.gather_axes`)."""
        return self._gathered[group.path]

    def gathered_by(self, group: ParamGroup) -> int:
        """How many devices ``group``'s fsdp-like axes split it over."""
        return math.prod(self.axes[a] for a in self.gather_axes(group))

    @functools.cached_property
    def optimizer_shards(self) -> int:
        """What the optimizer state is split over beyond the parameters: the replica axes
        under ZeRO-1 (``shard_over_data``), else 1."""
        if not self.options.shard_over_data:
            return 1
        return math.prod(self.axes[a] for a in self.replica_axes)

    @functools.cached_property
    def compute_shards(self) -> int:
        """What divides a device's per-token work beyond its tokens: the width axes
        (each device runs its share of every matmul) and the stages (its layers)."""
        return self.width_shards * self.layer_shards

    def traffic(self) -> list[tuple[str, Traffic]]:
        """``[(axis, traffic)]``: every axis over 1's collectives in a step, from its
        kind's term (:attr:`~datarax.parallel.kinds.ParallelismKind.traffic`)."""
        out: list[tuple[str, Traffic]] = []
        for axis, size in self.axes.items():
            term = self.kind(axis).traffic
            if size > 1 and term is not None:
                out.extend((axis, t) for t in term(self, axis))
        return out

    def whole_params(self) -> list[WholeParam]:
        """The parameter groups an axis over 1 was meant to split and does not divide,
        which stay whole on it (:func:`~datarax.parallel.axis_roles.param_specs`): one
        entry per group and kind of split (the tensor dimension over the width axes, the
        experts over the expert axes, a dimension over the fsdp-like axes), the most
        bytes first. A plan's ``warnings`` carries each
        (:meth:`WholeParam.warning`)."""
        width = self.axes_where(lambda k: k.splits_width)
        experts = self.axes_where(lambda k: k.splits_experts)
        itemsize = DTYPE_BYTES[getattr(self.model, "param_dtype", self.model.dtype)]
        out: list[WholeParam] = []
        for group, spec, shard, fsdp_split in self.specs:
            held = math.prod(shard) * itemsize * repeat_per_device(group, self.layer_shards)
            dim = group.tensor_dim()
            missed: list[tuple[str, tuple[str, ...]]] = []
            if width and dim is not None and spec[dim] is None:
                missed.append((f"not its dimension {dim} ({group.shape[dim]})", width))
            if experts and group.expert and spec[0] is None:
                missed.append((f"not its {group.shape[0]} experts", experts))
            gathered = self.gather_axes(group)
            if gathered and not fsdp_split:
                missed.append(("none of its dimensions", gathered))
            for what, axes in missed:
                n = math.prod(self.axes[a] for a in axes)
                extra = held - held // n
                out.append(WholeParam(group.path, group.shape, axes, n, what, held, extra))
        return sorted(out, key=lambda w: -w.extra_bytes)

    def kind_memory(self) -> dict[str, float]:
        """The named transient bytes the mesh's kinds add on each device (their
        :attr:`~datarax.parallel.kinds.ParallelismKind.memory` terms), once per kind."""
        out: dict[str, float] = {}
        present = dict.fromkeys(self.roles.values())
        for name in present:
            term = KINDS[name].memory
            if term is not None:
                out.update(term(self))
        return out


def _product(
    axes: Mapping[str, int], roles: Mapping[str, str], wanted: Callable[[ParallelismKind], bool]
) -> int:
    return math.prod(int(n) for a, n in axes.items() if wanted(KINDS[roles[a]]))


def mesh_context(
    model: ModelSpec | Mapping[str, Any],
    axes: Mapping[str, int],
    global_batch: int,
    *,
    roles: Mapping[str, str] | None = None,
    options: ParallelOptions | None = None,
    specs: tuple[ParamSharding, ...] | None = None,
    checked_axes: Mapping[str, int] | None = None,
) -> MeshContext:
    """Build a request's :class:`MeshContext`, checking that every axis's kind applies.

    Args:
      model: a :class:`~datarax.specs.model_specs.ModelSpec` or its JSON form.
      axes: ``{axis: size}`` (ici times dcn).
      global_batch: sequences a step takes over the mesh.
      roles: ``{axis: kind}`` where the names do not say it.
      options: the pipeline, context-parallel and ZeRO-1 options.
      specs: the parameter shardings, where the caller has them already.
      checked_axes: axes the caller already passed through
        :func:`~datarax.parallel.axis_roles.check_kinds_apply` with this model and
        options (a plan checks the axes it is given before laying out its devices); the
        check is not run again when they are these axes.

    Raises:
      PlanError: ``invalid_model``, ``unknown_axis_role``, ``invalid_parallelism`` (an
        unpriced kind over 1, or a kind the model gives nothing to split),
        ``tensor_not_divisible``, ``invalid_batch_shape``, ``batch_not_divisible``.
    """
    if not isinstance(model, MLPSpec | TransformerSpec):
        model = model_spec(model)
    axes = {name: int(size) for name, size in axes.items()}
    roles = axis_roles(list(axes), roles)
    options = options or ParallelOptions()
    sizes = role_sizes(axes, roles)  # refuses unpriced kinds over 1
    width = _product(axes, roles, lambda k: k.splits_width)
    check_tensor_split(model, width)
    if checked_axes is None or {a: int(n) for a, n in checked_axes.items()} != axes:
        check_kinds_apply(model, axes, roles, options.context)
    batch = _product(axes, roles, lambda k: k.splits_batch)
    cp = _product(axes, roles, lambda k: k.splits_sequence)
    stages = _product(axes, roles, lambda k: k.splits_layers)
    tokens = tokens_per_device(model, global_batch, batch, cp)
    local_batch = global_batch // batch
    shape = None
    if stages > 1 and isinstance(model, TransformerSpec):
        shape = pipeline_shape(
            options.pipeline,
            stages=stages,
            layers=pipelined_layers(model),
            local_batch=local_batch,
        )
    if specs is None:
        specs = tuple(param_specs(model, axes, roles))
    return MeshContext(
        model=model,
        axes=axes,
        roles=roles,
        options=options,
        global_batch=global_batch,
        sizes=sizes,
        batch_shards=batch,
        sequence_shards=cp,
        activation_sequence_shards=_product(axes, roles, lambda k: k.splits_stream),
        width_shards=width,
        expert_shards=_product(axes, roles, lambda k: k.splits_experts),
        layer_shards=stages,
        local_batch=local_batch,
        tokens=tokens,
        pipeline=shape,
        specs=specs,
    )
