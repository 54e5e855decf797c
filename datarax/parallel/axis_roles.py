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
from collections.abc import Mapping, Sequence

from datarax.estimate.model_specs import ModelSpec, ParamGroup, TransformerSpec
from datarax.plan.layout import PlanError, SpecEntry

__all__ = [
    "AXIS_ROLES",
    "ParamSharding",
    "axis_roles",
    "check_tensor_split",
    "param_specs",
    "role_axes",
    "role_sizes",
    "tokens_per_device",
]

type ParamSharding = tuple[ParamGroup, tuple[SpecEntry, ...], tuple[int, ...], bool]
"""``(group, spec, shard_shape, fsdp_split)``: one parameter group under the roles."""

AXIS_ROLES: tuple[str, ...] = ("data", "fsdp", "tensor")
_ROLE_BY_NAME = {
    "data": "data",
    "batch": "data",
    "replica": "data",
    "fsdp": "fsdp",
    "tensor": "tensor",
    "model": "tensor",
    # MaxText's mesh_axes (datarax.launch.maxtext), by how its base.yml
    # logical_axis_rules shard a dense decoder: the batch and replicas (data), the
    # weights' embed dimension with the batch (fsdp), heads/mlp/vocab (tensor). Plans from
    # MaxText keys hold the axes other than data, fsdp, fsdp_transpose, tensor at size 1.
    "diloco": "data",
    "stage": "data",
    "fsdp_transpose": "fsdp",
    "context": "fsdp",
    "context_usp_ulysses": "fsdp",
    "context_autoregressive": "data",
    "tensor_sequence": "tensor",
    "expert": "fsdp",
    "autoregressive": "tensor",
}


def axis_roles(names: Sequence[str], roles: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{axis: role}`` for every mesh axis: ``roles`` where given, else by name.

    Raises:
      PlanError: ``unknown_axis_role`` for a role outside :data:`AXIS_ROLES` or an axis
        whose name says nothing (name it ``data``, ``fsdp`` or ``tensor``, or pass roles).
    """
    roles = dict(roles or {})
    out = {}
    for name in names:
        role = roles.pop(name, None) or _ROLE_BY_NAME.get(name)
        if role not in AXIS_ROLES:
            raise PlanError(
                "unknown_axis_role",
                f"axis {name!r} has role {role!r}; give it one of {list(AXIS_ROLES)} "
                f"(e.g. roles={{{name!r}: 'data'}}) or name the axis data, fsdp or tensor",
            )
        out[name] = role
    if roles:
        raise PlanError(
            "unknown_axis_role",
            f"roles name axes {sorted(roles)} that the mesh does not have ({list(names)})",
        )
    return out


def role_sizes(axes: Mapping[str, int], roles: Mapping[str, str]) -> dict[str, int]:
    sizes = dict.fromkeys(AXIS_ROLES, 1)
    for name, size in axes.items():
        sizes[roles[name]] *= int(size)
    return sizes


def role_axes(axes: Mapping[str, int], roles: Mapping[str, str], role: str) -> tuple[str, ...]:
    return tuple(name for name, size in axes.items() if roles[name] == role and size > 1)


def _split(names: tuple[str, ...]) -> str | tuple[str, ...] | None:
    if not names:
        return None
    return names[0] if len(names) == 1 else names


def param_specs(
    model: ModelSpec, axes: Mapping[str, int], roles: Mapping[str, str]
) -> list[ParamSharding]:
    """Each parameter group's PartitionSpec entries, per-device shard shape, and whether
    the fsdp axes split it.

    The tensor axes split the dimension of the group's role (``ParamGroup.tensor_dim``)
    when it divides; the fsdp axes split the first other dimension they divide, else
    none (the parameter stays whole on the fsdp axes and its gradient is all-reduced
    over them instead of reduce-scattered).

    Returns:
      ``[(group, spec, shard_shape, fsdp_split)]``; ``spec`` entries are ``None``, an
      axis name or a tuple of names, as ``PartitionSpec`` takes them.
    """
    tensor_axes = role_axes(axes, roles, "tensor")
    fsdp_axes = role_axes(axes, roles, "fsdp")
    t = math.prod(axes[a] for a in tensor_axes)
    f = math.prod(axes[a] for a in fsdp_axes)
    out: list[ParamSharding] = []
    for group in model.params():
        spec: list[SpecEntry] = [None] * len(group.shape)
        shard = list(group.shape)
        dim = group.tensor_dim()
        if t > 1 and dim is not None and shard[dim] % t == 0:
            spec[dim] = _split(tensor_axes)
            shard[dim] //= t
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


def tokens_per_device(model: ModelSpec, global_batch: int, batch_shards: int) -> int:
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise PlanError(
            "invalid_batch_shape", f"global_batch must be a positive integer, got {global_batch!r}"
        )
    if global_batch % batch_shards:
        low = global_batch // batch_shards * batch_shards
        raise PlanError(
            "batch_not_divisible",
            f"global_batch {global_batch} does not split over the {batch_shards} data x fsdp "
            f"shards; use {low or batch_shards} or {low + batch_shards}",
        )
    return global_batch // batch_shards * model.tokens_per_example


def check_tensor_split(model: ModelSpec, t: int) -> None:
    if t > 1 and isinstance(model, TransformerSpec):
        for what, value in (("heads", model.heads), ("d_ff", model.d_ff)):
            if value % t:
                raise PlanError(
                    "tensor_not_divisible",
                    f"model {what} {value} does not split over tensor={t}; use a tensor size "
                    f"dividing both heads ({model.heads}) and d_ff ({model.d_ff})",
                )
