"""Parameter sharding rules: which PartitionSpec each parameter gets under a named rule.

Rules (the service's ``param_sharding`` uses the same table):

- ``replicate``: every parameter whole on every device (data parallelism).
- ``model``: tensor parallelism over the ``model`` axis. Matrices (ndim >= 2) split their
  last (output) dimension, column-parallel; when it does not divide, their first. Vectors
  (biases) split dimension 0.
- ``fsdp``: fully sharded data parallelism over the ``fsdp`` axis. Every parameter
  splits its first dimension; when it does not divide, its last.

A parameter the rule cannot split (axis missing from the mesh, no divisible dimension,
a scalar) stays replicated, and a warning says why: plans report those warnings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
from jax.sharding import PartitionSpec as P

PARAM_SHARDING_RULES: tuple[str, ...] = ("replicate", "model", "fsdp")
_RULE_AXIS = {"model": "model", "fsdp": "fsdp"}


def param_partition_spec(
    shape: Sequence[int], axes: Mapping[str, int], rule: str, path: str = ""
) -> tuple[tuple[str | None, ...], str | None]:
    """PartitionSpec entries for one parameter under ``rule``.

    Args:
      shape: the parameter's shape.
      axes: the mesh's ``{axis name: size}``.
      rule: one of ``PARAM_SHARDING_RULES``.
      path: the parameter's path (``layers/0/kernel``), used in warnings only.

    Returns:
      ``(spec, warning)``: spec has one entry per dimension (``None`` or an axis name);
      warning is ``None`` or a sentence saying why the parameter stayed replicated.

    Raises:
      ValueError: an unknown rule.
    """
    if rule not in PARAM_SHARDING_RULES:
        raise ValueError(
            f"unknown param_sharding rule {rule!r}; use one of {list(PARAM_SHARDING_RULES)}"
        )
    ndim = len(shape)
    replicated: tuple[str | None, ...] = (None,) * ndim
    if rule == "replicate" or ndim == 0:
        return replicated, None
    axis = _RULE_AXIS[rule]
    if axis not in axes:
        return replicated, f"{path or 'parameter'}: mesh has no {axis!r} axis; replicated"
    size = axes[axis]
    if rule == "model":
        order = [ndim - 1, 0] if ndim >= 2 else [0]
    else:
        order = [0, ndim - 1] if ndim >= 2 else [0]
    for dim in order:
        if shape[dim] % size == 0:
            spec = [None] * ndim
            spec[dim] = axis
            return tuple(spec), None
    return replicated, (
        f"{path or 'parameter'}: shape {tuple(shape)} has no dimension divisible by "
        f"{axis}={size}; replicated"
    )


def path_to_str(path: Sequence[Any]) -> str:
    """``(DictKey('layers'), DictKey(0), DictKey('kernel'), GetAttrKey('value'))`` ->
    ``'layers/0/kernel'``: NNX's ``.value`` hop is not part of a parameter's name."""
    parts: list[str] = []
    for key in path:
        if isinstance(key, jax.tree_util.DictKey):
            parts.append(str(key.key))
        elif isinstance(key, jax.tree_util.SequenceKey):
            parts.append(str(key.idx))
        elif isinstance(key, jax.tree_util.GetAttrKey):
            if key.name != "value":
                parts.append(key.name)
        elif isinstance(key, jax.tree_util.FlattenedIndexKey):
            parts.append(str(key.key))
        else:
            parts.append(str(key))
    return "/".join(parts)


def spec_of(entries: Sequence[str | None]) -> P:
    """A ``PartitionSpec`` from per-dimension entries."""
    return P(*entries)
