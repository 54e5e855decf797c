"""The registry of parallelism kinds: one frozen entry per kind, read by every part that
prices, shards, lays out, recommends, compiles or launches a mesh.

A mesh axis has one *kind* (its role): ``data``, ``fsdp``, ``tensor``, ``expert``,
``stage`` or ``context`` today, with ``ulysses``, ``sequence``, ``diloco`` and
``autoregressive`` known by name but not priced yet. An axis takes the kind its name
says: the kind's own name or one of its :attr:`ParallelismKind.aliases` (``batch`` is
``data``, ``model`` is ``tensor``, MaxText's ``fsdp_transpose`` is ``fsdp``). A name no
kind claims is refused;
so is an axis over 1 of a kind that is not priced (:func:`check_priced`): one kind is
never taken for another.

Adding a kind is one :class:`ParallelismKind` in :data:`KINDS` plus its tests; the
estimates read :attr:`~ParallelismKind.splits_batch`, :attr:`~ParallelismKind.param_split`
and :attr:`~ParallelismKind.collectives`, the MaxText mapping
:attr:`~ParallelismKind.maxtext_axes`.

Plain data, no NumPy and no JAX: the HTTP process plans with it.

Example:
  >>> kind_of_axis("batch").name
  'data'
  >>> [k.name for k in KINDS.values() if k.priced]
  ['data', 'fsdp', 'tensor', 'expert', 'stage', 'context']
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from datarax.errors import PlanError
from datarax.names import did_you_mean

__all__ = [
    "KINDS",
    "PRICED_KINDS",
    "ParamSplit",
    "CollectiveTerm",
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
``layers`` logical axis is ``stage``)."""


@dataclass(frozen=True)
class CollectiveTerm:
    """One collective a kind adds to a training step.

    Attributes:
      op: ``all-reduce``, ``all-gather``, ``reduce-scatter``, ``all-to-all`` or
        ``send-recv``, as ``step_estimate.breakdown.collectives`` names them.
      operand: what travels: ``gradients``, ``params``, ``activations``, ``tokens`` or
        ``keys and values``.
      when: when in the step it runs, in words.
    """

    op: str
    operand: str
    when: str


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
      compiled: whether the library's program (:mod:`datarax.spmd.compile_step`) builds
        the kind; compile checks refuse the others with ``invalid_parallelism`` while
        plans price them.
      param_split: which parameter dimension the axis splits (:data:`ParamSplit`).
      shards_state: whether gradients and optimizer state are split with the
        parameters (fsdp), rather than held whole wherever the parameters are.
      collectives: what it adds to a step, in order.
      maxtext_axes: MaxText's mesh axes of this kind (``base.yml`` ``mesh_axes``); the
        first is where a plan's axis of this kind goes in a launch config.
      summary: one sentence for error messages and docs.
    """

    name: str
    aliases: tuple[str, ...]
    priced: bool
    splits_batch: bool
    param_split: ParamSplit
    shards_state: bool
    collectives: tuple[CollectiveTerm, ...]
    maxtext_axes: tuple[str, ...]
    summary: str
    splits_sequence: bool = False
    compiled: bool = False

    def names(self) -> tuple[str, ...]:
        """The kind's name and aliases: every axis name that takes this kind."""
        return (self.name, *self.aliases)


def _kind(name: str, **fields: object) -> tuple[str, ParallelismKind]:
    return name, ParallelismKind(name=name, **fields)  # type: ignore[arg-type]


KINDS: Mapping[str, ParallelismKind] = dict(
    [
        _kind(
            "data",
            aliases=("batch", "replica"),
            compiled=True,
            priced=True,
            splits_batch=True,
            param_split="none",
            shards_state=False,
            collectives=(CollectiveTerm("all-reduce", "gradients", "once per step"),),
            maxtext_axes=("data",),
            summary="splits the batch; parameters whole on every device, gradients all-reduced",
        ),
        _kind(
            "fsdp",
            aliases=("fsdp_transpose",),
            compiled=True,
            priced=True,
            splits_batch=True,
            param_split="first_divisible",
            shards_state=True,
            collectives=(
                CollectiveTerm("all-gather", "params", "each layer, forward and backward"),
                CollectiveTerm("reduce-scatter", "gradients", "once per step"),
            ),
            maxtext_axes=("fsdp", "fsdp_transpose"),
            summary="splits the batch and the parameters, gradients and optimizer state",
        ),
        _kind(
            "tensor",
            aliases=("model",),
            compiled=True,
            priced=True,
            splits_batch=False,
            param_split="tensor_dim",
            shards_state=True,
            collectives=(CollectiveTerm("all-reduce", "activations", "after each row matmul"),),
            maxtext_axes=("tensor",),
            summary="splits heads, the MLP and the vocabulary (Megatron-style)",
        ),
        _kind(
            "expert",
            aliases=(),
            priced=True,
            compiled=True,
            splits_batch=True,
            param_split="expert_dim",
            shards_state=True,
            collectives=(
                CollectiveTerm("all-to-all", "tokens", "each MoE layer, dispatch and combine"),
                CollectiveTerm("all-gather", "params", "the non-expert weights, as fsdp"),
                CollectiveTerm("reduce-scatter", "gradients", "the non-expert weights, as fsdp"),
            ),
            maxtext_axes=("expert",),
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
            shards_state=True,
            collectives=(
                CollectiveTerm("send-recv", "activations", "each microbatch, to the next stage"),
                CollectiveTerm("send-recv", "gradients", "each microbatch, to the stage before"),
            ),
            maxtext_axes=("stage",),
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
            shards_state=True,
            collectives=(
                CollectiveTerm(
                    "all-gather", "keys and values", "each attention layer (or a ring of them)"
                ),
                CollectiveTerm("all-gather", "params", "each layer, as fsdp"),
                CollectiveTerm("reduce-scatter", "gradients", "once per step, as fsdp"),
            ),
            maxtext_axes=("context",),
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
            shards_state=True,
            collectives=(CollectiveTerm("all-to-all", "heads", "each attention layer"),),
            maxtext_axes=("context_usp_ulysses",),
            summary="Ulysses context parallelism: heads exchanged by all-to-all for attention",
        ),
        _kind(
            "sequence",
            aliases=("tensor_sequence",),
            priced=False,
            splits_batch=False,
            param_split="none",
            shards_state=False,
            collectives=(),
            maxtext_axes=("tensor_sequence",),
            summary="splits the sequence of the activations outside attention",
        ),
        _kind(
            "diloco",
            aliases=(),
            priced=False,
            splits_batch=True,
            param_split="none",
            shards_state=False,
            collectives=(),
            maxtext_axes=("diloco",),
            summary="DiLoCo replicas, synchronised every few steps",
        ),
        _kind(
            "autoregressive",
            aliases=("context_autoregressive",),
            priced=False,
            splits_batch=False,
            param_split="none",
            shards_state=False,
            collectives=(),
            maxtext_axes=("autoregressive", "context_autoregressive"),
            summary="MaxText's axis for autoregressive decoding (inference)",
        ),
    ]
)
"""Every kind by name, in MaxText's mesh order where it has one."""

PRICED_KINDS: tuple[str, ...] = tuple(name for name, kind in KINDS.items() if kind.priced)
"""The kinds the estimates price: ``('data', 'fsdp', 'tensor', 'expert', 'stage',
'context')``."""


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
