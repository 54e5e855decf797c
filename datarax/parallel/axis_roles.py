"""Axis roles: which mesh axes split the batch, the parameters or the tensors, and the
parameter shardings those roles give.

Parallelism is named by axis *roles*: ``data`` (batch split, parameters replicated,
gradients all-reduced), ``fsdp`` (batch split and parameters, gradients and optimizer
state sharded; parameters all-gathered where used, gradients reduce-scattered) and
``tensor`` (Megatron-style: ``col`` parameters split their output dimension, ``row``
ones their input, activations all-reduced after each ``row`` matmul). By default an
axis's role is its name (``model`` means ``tensor``, ``batch`` means ``data``).

Plain arithmetic over names and sizes; the step-memory (:mod:`~datarax.estimate.memory`)
and step-time (:mod:`~datarax.estimate.cost`) estimates and the compiled step
(:mod:`~datarax.spmd.compile_step`) share it.

Example:
  >>> axis_roles(["batch", "fsdp", "model"])
  {'batch': 'data', 'fsdp': 'fsdp', 'model': 'tensor'}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from datarax.errors import PlanError
from datarax.parallel.kinds import (
    KINDS,
    PRICED_KINDS,
    ParallelismKind,
    ParamSplit,
    check_priced,
    kind_of_axis,
    kinds_by_alias,
)
from datarax.parallel.options import (
    ContextParallel,
    check_context_split,
    check_stage_split,
    pipelined_layers,
)
from datarax.parallel.terms import repeat_per_device
from datarax.plan.layout import SpecEntry
from datarax.specs.model_specs import ModelSpec, ParamGroup, TransformerSpec

__all__ = [
    "AXIS_ROLES",
    "ParamSharding",
    "axis_roles",
    "batch_axes",
    "batch_split_axes",
    "check_expert_split",
    "check_kinds_apply",
    "check_named_kinds",
    "repeat_per_device",
    "gather_axes",
    "check_tensor_split",
    "param_specs",
    "replica_axes",
    "role_axes",
    "role_sizes",
    "split_axes",
    "tokens_per_device",
]

type ParamSharding = tuple[ParamGroup, tuple[SpecEntry, ...], tuple[int, ...], bool]
"""``(group, spec, shard_shape, fsdp_split)``: one parameter group under the roles."""

AXIS_ROLES: tuple[str, ...] = PRICED_KINDS
"""The roles the estimates price, from the registry (:data:`~datarax.parallel.kinds.KINDS`)."""


def axis_roles(names: Sequence[str], roles: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{axis: kind}`` for every mesh axis: ``roles`` where given, else by name.

    A name or role is a kind of :data:`~datarax.parallel.kinds.KINDS` or one of its
    aliases (``batch`` is ``data``, ``model`` is ``tensor``, MaxText's
    ``fsdp_transpose`` is ``fsdp``); the answer holds the kind's own name. Kinds that
    are not priced (``expert``, ``stage``, ``context`` ...) are named here and refused
    by :func:`role_sizes` when their axis is over 1: one kind is never read as another.

    Raises:
      PlanError: ``unknown_axis_role`` for an axis or role no kind claims (the message
        lists the kinds), or roles for axes the mesh does not have.
    """
    roles = dict(roles or {})
    out = {name: kind_of_axis(name, roles.pop(name, None)).name for name in names}
    if roles:
        raise PlanError(
            "unknown_axis_role",
            f"roles name axes {sorted(roles)} that the mesh does not have ({list(names)})",
        )
    return out


def role_sizes(axes: Mapping[str, int], roles: Mapping[str, str]) -> dict[str, int]:
    """``{priced kind: product of its axes' sizes}``.

    Raises:
      PlanError: ``invalid_parallelism`` for an axis over 1 whose kind is not priced.
    """
    check_priced(axes, roles)
    sizes = dict.fromkeys(AXIS_ROLES, 1)
    for name, size in axes.items():
        if roles[name] in sizes:
            sizes[roles[name]] *= int(size)
    return sizes


def check_named_kinds(axes: Mapping[str, int]) -> None:
    """Refuse an axis over 1 whose *name* is a kind that is not priced (``expert``,
    ``stage``, MaxText's ``context`` ...), whether or not a model is priced on the mesh:
    a hardware plan's launch configs and batch split read the kinds from the names.
    Names no kind claims pass here (a plan without a model may name axes freely).

    Args:
      axes: ``{axis: size}`` (ici times dcn).

    Raises:
      PlanError: ``invalid_parallelism``.
    """
    claimed = {name: kinds_by_alias().get(name) for name in axes}
    check_priced(
        {name: size for name, size in axes.items() if claimed[name] is not None},
        {name: kind.name for name, kind in claimed.items() if kind is not None},
    )


def check_kinds_apply(
    model: ModelSpec | None,
    axes: Mapping[str, int],
    roles: Mapping[str, str] | None = None,
    context_options: ContextParallel | None = None,
) -> None:
    """Refuse axes over 1 whose kind the model gives nothing to split, before any
    layout: an expert axis on a dense model or experts the axis does not divide
    (:func:`check_expert_split`), stages or a context axis on a model without stacked
    layers or sequences, stages that do not divide the layers, a context axis that does
    not divide the sequence (:func:`~datarax.parallel.options.check_context_split`).
    ``roles``: each axis's kind; default the kinds the names say (names no kind claims
    are skipped, as :func:`check_named_kinds` skips them).

    Raises:
      PlanError: ``invalid_parallelism``, saying what would apply.
    """
    if model is None:
        return
    claimed = kinds_by_alias()
    if roles is None:
        roles = {name: claimed[name].name for name in axes if name in claimed}

    def product(wanted: Callable[[ParallelismKind], bool]) -> int:
        return math.prod(
            int(size) for name, size in axes.items() if name in roles and wanted(KINDS[roles[name]])
        )

    check_expert_split(model, product(lambda kind: kind.splits_experts))
    stages = product(lambda kind: kind.splits_layers)
    context = product(lambda kind: kind.splits_sequence)
    stream = product(lambda kind: kind.splits_stream)
    for what, size in (
        ("pipeline stages", stages),
        ("a context axis", context),
        ("a sequence axis", stream),
    ):
        if size > 1 and not isinstance(model, TransformerSpec):
            raise PlanError(
                "invalid_parallelism",
                f"{what} of {size} need a transformer (stacked layers split into stages, "
                "sequences split for attention), and this model is an MLP: put those devices "
                "on data or fsdp",
            )
    if isinstance(model, TransformerSpec):
        layers = pipelined_layers(model)
        check_stage_split(layers, stages, model.layers - layers)
        check_context_split(model.seq_len, context, context_options or ContextParallel())
        if stream > 1 and model.seq_len % (stream * context):
            raise PlanError(
                "invalid_parallelism",
                f"the sequence axes ({stream}) split each context shard's "
                f"{model.seq_len // context} tokens along the sequence between the "
                "tensor-parallel regions, and do not divide them: use a sequence size "
                f"dividing {model.seq_len // context}, or put those devices on tensor",
            )


def role_axes(axes: Mapping[str, int], roles: Mapping[str, str], role: str) -> tuple[str, ...]:
    return tuple(name for name, size in axes.items() if roles[name] == role and size > 1)


def split_axes(
    axes: Mapping[str, int], roles: Mapping[str, str], split: ParamSplit
) -> tuple[str, ...]:
    """The axes over 1 whose kind splits parameters as ``split`` says (the registry's
    :attr:`~datarax.parallel.kinds.ParallelismKind.param_split`), mesh order."""
    return tuple(
        name for name, size in axes.items() if KINDS[roles[name]].param_split == split and size > 1
    )


def batch_axes(axes: Mapping[str, int], roles: Mapping[str, str]) -> tuple[str, ...]:
    """The axes whose kind splits the batch (``data`` and ``fsdp`` today), mesh order,
    size-1 axes included: the batch's partition spec names them."""
    return tuple(name for name in axes if KINDS[roles[name]].splits_batch)


def batch_split_axes(axes: Mapping[str, int], roles: Mapping[str, str]) -> tuple[str, ...]:
    """The axes over 1 that split the batch, kind by kind in the registry's order (all
    ``data`` axes, then all ``fsdp`` axes): the order a batch's partition spec takes."""
    return tuple(
        name
        for kind in PRICED_KINDS
        if KINDS[kind].splits_batch
        for name in role_axes(axes, roles, kind)
    )


def replica_axes(axes: Mapping[str, int], roles: Mapping[str, str]) -> tuple[str, ...]:
    """The axes over 1 that split the batch but no parameter: their gradients are
    all-reduced whole (``data`` today)."""
    return tuple(
        name
        for name, size in axes.items()
        if KINDS[roles[name]].splits_batch and KINDS[roles[name]].param_split == "none" and size > 1
    )


def _split(names: tuple[str, ...]) -> str | tuple[str, ...] | None:
    if not names:
        return None
    return names[0] if len(names) == 1 else names


def gather_axes(
    group: ParamGroup, axes: Mapping[str, int], roles: Mapping[str, str]
) -> tuple[str, ...]:
    """The axes over 1 that split ``group`` as fsdp does (all-gathered where it is used,
    gradients reduce-scattered): the fsdp axes and, for every group but the routed
    experts, the expert axes (MaxText's rules shard the other weights over ``expert``
    as over ``fsdp``), mesh order."""
    fsdp_like = ("first_divisible",) if group.expert else ("first_divisible", "expert_dim")
    return tuple(
        name
        for name, size in axes.items()
        if KINDS[roles[name]].param_split in fsdp_like and size > 1
    )


def param_specs(
    model: ModelSpec, axes: Mapping[str, int], roles: Mapping[str, str]
) -> list[ParamSharding]:
    """Each parameter group's PartitionSpec entries, per-device shard shape, and whether
    the fsdp-like axes (:func:`gather_axes`) split it.

    The expert axes split the routed experts' first dimension (``[experts, ...]``); the
    tensor axes split the dimension of the group's role (``ParamGroup.tensor_dim``)
    when it divides; the group's :func:`gather_axes` split the first other dimension
    they divide, else none (the parameter stays whole on them and its gradient is
    all-reduced over them instead of reduce-scattered).

    Returns:
      ``[(group, spec, shard_shape, fsdp_split)]``; ``spec`` entries are ``None``, an
      axis name or a tuple of names, as ``PartitionSpec`` takes them.
    """
    tensor_axes = split_axes(axes, roles, "tensor_dim")
    expert_axes = split_axes(axes, roles, "expert_dim")
    t = math.prod(axes[a] for a in tensor_axes)
    e = math.prod(axes[a] for a in expert_axes)
    out: list[ParamSharding] = []
    for group in model.params():
        spec: list[SpecEntry] = [None] * len(group.shape)
        shard = list(group.shape)
        if group.expert and e > 1 and shard[0] % e == 0:
            spec[0] = _split(expert_axes)
            shard[0] //= e
        dim = group.tensor_dim()
        if t > 1 and dim is not None and shard[dim] % t == 0:
            spec[dim] = _split(tensor_axes)
            shard[dim] //= t
        fsdp_axes = gather_axes(group, axes, roles)
        f = math.prod(axes[a] for a in fsdp_axes)
        fsdp_split = False
        if f > 1:
            for d in range(len(shard)):
                if spec[d] is None and shard[d] % f == 0:
                    spec[d] = _split(fsdp_axes)
                    shard[d] //= f
                    fsdp_split = True
                    break
        out.append((group, tuple(spec), tuple(shard), fsdp_split))
    return out


def tokens_per_device(
    model: ModelSpec, global_batch: int, batch_shards: int, sequence_shards: int = 1
) -> int:
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise PlanError(
            "invalid_batch_shape", f"global_batch must be a positive integer, got {global_batch!r}"
        )
    if global_batch % batch_shards:
        low = global_batch // batch_shards * batch_shards
        raise PlanError(
            "batch_not_divisible",
            f"global_batch {global_batch} does not split over the {batch_shards} batch "
            f"shards (data x fsdp x expert); use "
            + (f"{low} or {low + batch_shards}" if low else f"a multiple of {batch_shards}"),
        )
    return global_batch // batch_shards * model.tokens_per_example // sequence_shards


def check_expert_split(model: ModelSpec, e: int) -> None:
    """Refuse an expert axis over 1 that has no experts to split.

    Raises:
      PlanError: ``invalid_parallelism`` for an expert axis on a model without
        mixture-of-experts layers (name what would apply: fsdp, which splits the batch
        and the weights as the expert axis would), or experts the axis does not divide.
    """
    if e <= 1:
        return
    experts = model.num_experts if isinstance(model, TransformerSpec) and model.is_moe else 0
    if not experts:
        raise PlanError(
            "invalid_parallelism",
            f"an expert axis of size {e} needs a mixture-of-experts model (num_experts of 2 "
            "or more), and this one is dense: name the axis fsdp, which splits the batch "
            "and the weights as an expert axis would, or give the model its experts",
        )
    if experts % e:
        fits = [n for n in range(2, min(experts, e * 2) + 1) if experts % n == 0]
        raise PlanError(
            "invalid_parallelism",
            f"the expert axes ({e}) do not divide the model's {experts} experts: use an "
            f"expert size dividing {experts} (e.g. {fits[-1] if fits else 1}) and put the "
            "rest on fsdp",
        )


def check_tensor_split(model: ModelSpec, t: int) -> None:
    if t > 1 and isinstance(model, TransformerSpec):
        widths = [("heads", model.heads), ("d_ff", model.d_ff)]
        if model.is_moe:
            widths.append(("moe_d_ff", model.moe_d_ff))
        for what, value in widths:
            if value % t:
                raise PlanError(
                    "tensor_not_divisible",
                    f"model {what} {value} does not split over tensor={t}; use a tensor size "
                    f"dividing {' and '.join(f'{w} ({v})' for w, v in widths)}",
                )
