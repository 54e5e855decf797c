"""The registry of parallelism kinds: one frozen entry per kind, read by every part that
prices, shards, lays out, recommends, compiles or launches a mesh.

A mesh axis has one *kind* (its role): ``data``, ``fsdp``, ``tensor``, ``expert``,
``stage``, ``context`` or ``sequence`` today, with ``ulysses``, ``diloco`` and
``autoregressive`` known by name but not priced yet. An axis takes the kind its name
says: the kind's own name or one of its :attr:`ParallelismKind.aliases` (``batch`` is
``data``, ``model`` is ``tensor``, MaxText's ``fsdp_transpose`` is ``fsdp``). A name no
kind claims is refused; so is an axis over 1 of a kind that is not priced
(:func:`check_priced`): one kind is never taken for another.

An entry drives, it does not describe: what a kind splits (the batch, the sequence, the
residual stream, a parameter dimension) builds the request's
:class:`~datarax.parallel.context.MeshContext`, whose shard counts the memory and step-time
estimates read; its :attr:`~ParallelismKind.traffic` term is its collectives and its
:attr:`~ParallelismKind.memory` term its own transient bytes
(:mod:`datarax.parallel.terms`); :attr:`~ParallelismKind.maxtext_axes` is its MaxText
mapping. Adding a kind is one :class:`ParallelismKind` in :data:`KINDS`, its terms and
its tests.

Plain data, no NumPy and no JAX: the HTTP process plans with it.

Example:
  >>> kind_of_axis("batch").name
  'data'
  >>> [k.name for k in KINDS.values() if k.priced]
  ['data', 'fsdp', 'tensor', 'expert', 'stage', 'context', 'sequence']
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from datarax.errors import PlanError
from datarax.names import did_you_mean
from datarax.parallel import terms
from datarax.parallel.terms import MemoryTerm, TrafficTerm

__all__ = [
    "KINDS",
    "PRICED_KINDS",
    "axes_where",
    "kinds_of",
    "shards_where",
    "ParamSplit",
    "ParallelismKind",
    "check_compiled",
    "check_priced",
    "kind_of_axis",
    "kinds_by_alias",
]

type ParamSplit = Literal["none", "first_divisible", "tensor_dim", "expert_dim", "layer_dim"]
"""Which parameter dimension a kind splits: none (parameters whole on the axis), the
first dimension the axis size divides (fsdp), the group's tensor dimension (the
output of ``col`` matmuls, the input of ``row`` ones: Megatron's tensor parallelism), or
the experts dimension of the routed experts' stacked kernels (expert parallelism; the
other parameters are split over the axis as fsdp splits them, as MaxText's sharding
rules do), or the layers of the stacked per-layer groups (pipeline stages: MaxText's
``layers`` logical axis is ``stage``). Code outside the registry asks the kind's
predicates (:attr:`ParallelismKind.splits_width`, ``splits_experts``, ``gathers_params``,
``splits_layers``), never these values."""


@dataclass(frozen=True)
class ParallelismKind:
    """One kind of parallelism and everything the library needs to know of it.

    Attributes:
      name: the kind (the role an axis takes), e.g. ``fsdp``.
      aliases: other axis names that take this kind, ours and MaxText's.
      priced: whether memory, step time, recommendations and compile checks handle it;
        an axis over 1 of an unpriced kind is 422 ``invalid_parallelism``.
      splits_batch: whether the axis splits the global batch (its size divides it).
      splits_sequence: whether the axis splits each sequence (context parallelism: its
        size divides the sequence length).
      splits_stream: whether the axis splits the residual stream along the sequence
        between the width-split regions (sequence parallelism; MaxText's
        ``activation_norm_length``): its size divides the sequence length.
      compiled: whether the library's program (:mod:`datarax.spmd.compile_step`) builds
        the kind; compile checks refuse the others with ``invalid_parallelism`` while
        plans price them.
      param_split: which parameter dimension the axis splits (:data:`ParamSplit`).
      traffic: what one axis of the kind moves in a step
        (:data:`~datarax.parallel.terms.TrafficTerm`): the step estimate's collectives
        are these terms, priced on the axis's link.
      memory: the transient bytes the kind adds on each device
        (:data:`~datarax.parallel.terms.MemoryTerm`), or ``None``.
      maxtext_axes: MaxText's mesh axes of this kind (``base.yml`` ``mesh_axes``); the
        first is where a plan's axis of this kind goes in a launch config.
      searched: whether a recommendation searches an axis of this kind when the request
        names none: ``always``, for models with experts only (``moe``), or ``never``.
      summary: one sentence for error messages and docs.
    """

    name: str
    aliases: tuple[str, ...]
    priced: bool
    splits_batch: bool
    param_split: ParamSplit
    maxtext_axes: tuple[str, ...]
    summary: str
    traffic: TrafficTerm | None = None
    memory: MemoryTerm | None = None
    splits_sequence: bool = False
    splits_stream: bool = False
    compiled: bool = False
    searched: Literal["always", "moe", "never"] = "never"

    def names(self) -> tuple[str, ...]:
        """The kind's name and aliases: every axis name that takes this kind."""
        return (self.name, *self.aliases)

    @property
    def splits_width(self) -> bool:
        """Whether the axis splits the parameters' tensor dimension (heads, MLP,
        vocabulary) and the activations with them (tensor, sequence)."""
        return self.param_split == "tensor_dim"

    @property
    def splits_experts(self) -> bool:
        """Whether the axis splits the routed experts of mixture-of-experts layers."""
        return self.param_split == "expert_dim"

    @property
    def gathers_params(self) -> bool:
        """Whether the axis splits every parameter's first dimension it divides, gathered
        where the parameter is used (fsdp; context, whose weights MaxText's rules shard as
        fsdp's)."""
        return self.param_split == "first_divisible"

    @property
    def splits_layers(self) -> bool:
        """Whether the axis splits the stacked layers into pipeline stages."""
        return self.param_split == "layer_dim"


def _kind(name: str, **fields: object) -> tuple[str, ParallelismKind]:
    return name, ParallelismKind(name=name, **fields)  # type: ignore[arg-type]


KINDS: Mapping[str, ParallelismKind] = dict(
    [
        _kind(
            "data",
            aliases=("batch", "replica"),
            searched="always",
            compiled=True,
            priced=True,
            splits_batch=True,
            param_split="none",
            maxtext_axes=("data",),
            traffic=terms.data_traffic,
            summary="splits the batch; parameters whole on every device, gradients all-reduced",
        ),
        _kind(
            "fsdp",
            aliases=("fsdp_transpose",),
            searched="always",
            compiled=True,
            priced=True,
            splits_batch=True,
            param_split="first_divisible",
            maxtext_axes=("fsdp", "fsdp_transpose"),
            traffic=terms.gathered_param_traffic,
            summary="splits the batch and the parameters, gradients and optimizer state",
        ),
        _kind(
            "tensor",
            aliases=("model",),
            searched="always",
            compiled=True,
            priced=True,
            splits_batch=False,
            param_split="tensor_dim",
            maxtext_axes=("tensor",),
            traffic=terms.tensor_traffic,
            summary="splits heads, the MLP and the vocabulary (Megatron-style)",
        ),
        _kind(
            "expert",
            aliases=(),
            searched="moe",
            priced=True,
            compiled=True,
            splits_batch=True,
            param_split="expert_dim",
            maxtext_axes=("expert",),
            traffic=terms.expert_traffic,
            summary="splits the experts of mixture-of-experts layers (the batch and the other "
            "weights as fsdp); tokens reach their experts by all-to-all",
        ),
        _kind(
            "stage",
            aliases=(),
            priced=True,
            compiled=True,
            splits_batch=False,
            param_split="layer_dim",
            maxtext_axes=("stage",),
            traffic=terms.stage_traffic,
            memory=terms.stage_pass_bytes,
            summary="splits the layers into pipeline stages, each holding its layers; "
            "microbatches pass stage to stage",
        ),
        _kind(
            "context",
            aliases=(),
            priced=True,
            splits_batch=False,
            splits_sequence=True,
            compiled=True,
            param_split="first_divisible",
            maxtext_axes=("context",),
            traffic=terms.context_traffic,
            memory=terms.context_kv_bytes,
            summary="splits each sequence for attention (keys and values gathered or passed "
            "round a ring; the weights as fsdp)",
        ),
        _kind(
            "ulysses",
            aliases=("context_usp_ulysses",),
            priced=False,
            splits_batch=False,
            splits_sequence=True,
            param_split="first_divisible",
            maxtext_axes=("context_usp_ulysses",),
            summary="Ulysses context parallelism: heads exchanged by all-to-all for attention",
        ),
        _kind(
            "sequence",
            aliases=("tensor_sequence",),
            priced=True,
            splits_batch=False,
            splits_stream=True,
            param_split="tensor_dim",
            maxtext_axes=("tensor_sequence",),
            traffic=terms.sequence_traffic,
            summary="sequence parallelism (Megatron's; MaxText's tensor_sequence): the weights "
            "split as tensor splits them, the activations between them along the sequence; "
            "reduce-scatter and all-gather in place of tensor's all-reduce",
        ),
        _kind(
            "diloco",
            aliases=(),
            priced=False,
            splits_batch=True,
            param_split="none",
            maxtext_axes=("diloco",),
            summary="DiLoCo replicas, synchronised every few steps",
        ),
        _kind(
            "autoregressive",
            aliases=("context_autoregressive",),
            priced=False,
            splits_batch=False,
            param_split="none",
            maxtext_axes=("autoregressive", "context_autoregressive"),
            summary="MaxText's axis for autoregressive decoding (inference)",
        ),
    ]
)
"""Every kind by name, in MaxText's mesh order where it has one."""

PRICED_KINDS: tuple[str, ...] = tuple(name for name, kind in KINDS.items() if kind.priced)
"""The kinds the estimates price: ``('data', 'fsdp', 'tensor', 'expert', 'stage',
'context', 'sequence')``."""


def kinds_by_alias() -> dict[str, ParallelismKind]:
    """``{axis name: kind}`` for every name and alias of every kind."""
    return {alias: kind for kind in KINDS.values() for alias in kind.names()}


_BY_ALIAS = kinds_by_alias()
_PRICED_TEXT = ", ".join(
    f"{kind.name} ({', '.join(kind.aliases)})" if kind.aliases else kind.name
    for kind in KINDS.values()
    if kind.priced
)
_UNPRICED = tuple(name for name, kind in KINDS.items() if not kind.priced)


def _nearest(name: str) -> str:
    return did_you_mean(name, _BY_ALIAS)


def kind_of_axis(name: str, role: str | None = None) -> ParallelismKind:
    """The kind of the axis ``name``: ``role`` where given, else the kind its name says.

    Raises:
      PlanError: ``unknown_axis_role`` when neither ``role`` nor ``name`` is a kind or an
        alias; the message lists the kinds and suggests the nearest name.
    """
    claimed = role if role is not None else name
    kind = _BY_ALIAS.get(claimed)
    if kind is None:
        what = f"role {role!r} of axis {name!r}" if role is not None else f"axis {name!r}"
        raise PlanError(
            "unknown_axis_role",
            f"{what} is not a parallelism kind{_nearest(claimed)}. Name each axis for its "
            f"kind: the kinds priced are {_PRICED_TEXT}; {', '.join(_UNPRICED)} are known "
            "but not priced yet",
            library_hint=f". In Python, roles={{{name!r}: 'data'}} gives an axis a kind",
        )
    return kind


def kinds_of(
    axes: Mapping[str, int], roles: Mapping[str, str] | None = None
) -> dict[str, ParallelismKind]:
    """``{axis: kind}``: ``roles`` where given, else the kinds the names say; names no
    kind claims are left out (a plan without a model may name axes freely)."""
    if roles is not None:
        return {name: KINDS[roles[name]] for name in axes}
    return {name: _BY_ALIAS[name] for name in axes if name in _BY_ALIAS}


def axes_where(
    axes: Mapping[str, int],
    wanted: Callable[[ParallelismKind], bool],
    roles: Mapping[str, str] | None = None,
) -> tuple[str, ...]:
    """The axes over 1 whose kind ``wanted`` accepts (:func:`kinds_of`), mesh order.

    Example:
      >>> axes_where({"data": 2, "stage": 4, "x": 8}, lambda kind: kind.splits_layers)
      ('stage',)
    """
    kinds = kinds_of(axes, roles)
    return tuple(a for a, n in axes.items() if int(n) > 1 and a in kinds and wanted(kinds[a]))


def shards_where(
    axes: Mapping[str, int],
    wanted: Callable[[ParallelismKind], bool],
    roles: Mapping[str, str] | None = None,
) -> int:
    """The product of the sizes of :func:`axes_where`'s axes (1 when there are none)."""
    return math.prod(int(axes[a]) for a in axes_where(axes, wanted, roles))


def check_priced(axes: Mapping[str, int], roles: Mapping[str, str]) -> None:
    """Refuse an axis over 1 whose kind is not priced.

    Args:
      axes: ``{axis: size}`` (ici times dcn).
      roles: ``{axis: kind name}`` for every axis, as :func:`kind_of_axis` gives them.

    Raises:
      PlanError: ``invalid_parallelism``, naming the axis, its kind and the kinds that
        are priced.
    """
    for name, size in axes.items():
        kind = KINDS[roles[name]]
        if int(size) > 1 and not kind.priced:
            raise PlanError(
                "invalid_parallelism",
                f"axis {name!r} of size {size} is {kind.name} parallelism ({kind.summary}), "
                f"which plans do not price yet. Use only {', '.join(PRICED_KINDS)} axes "
                f"over 1, or set {name!r} to 1",
            )


def check_compiled(axes: Mapping[str, int], roles: Mapping[str, str]) -> None:
    """Refuse an axis over 1 whose kind the library's program does not build
    (:attr:`ParallelismKind.compiled`): compile checks and sessions run that program, so
    a kind it would leave out is refused rather than compiled as something else.

    Raises:
      PlanError: ``invalid_parallelism``, naming the axis and the kinds it builds.
    """
    built = [name for name, kind in KINDS.items() if kind.compiled]
    for name, size in axes.items():
        kind = KINDS[roles[name]]
        if int(size) > 1 and not kind.compiled:
            raise PlanError(
                "invalid_parallelism",
                f"axis {name!r} of size {size} is {kind.name} parallelism ({kind.summary}): "
                f"plans price it, but the library's training program builds only "
                f"{', '.join(built)} axes, so it cannot be compiled or run here. Set "
                f"{name!r} to 1, or plan it without a compile check",
            )
