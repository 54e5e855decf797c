"""Named parameter sharding rules (the service's ``param_sharding``): which
``PartitionSpec`` entries each parameter gets. Plain arithmetic over shapes, no JAX, so
the HTTP process plans with it.

- ``replicate``: every parameter whole on every device (data parallelism).
- ``model``: tensor parallelism over the ``model`` axis. Matrices (ndim >= 2) split their
  last (output) dimension, column-parallel; when it does not divide, their first. Vectors
  (biases) split dimension 0.
- ``fsdp``: fully sharded data parallelism over the ``fsdp`` axis. Every parameter
  splits its first dimension; when it does not divide, its last.

A parameter the rule cannot split (axis missing from the mesh, no divisible dimension,
a scalar) stays replicated, and a warning says why: plans report those warnings.

Example:
  >>> param_partition_spec([16, 64], {"data": 2, "model": 4}, "model")
  ((None, 'model'), None)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["PARAM_SHARDING_RULES", "param_partition_spec"]

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
            spec: list[str | None] = [None] * ndim
            spec[dim] = axis
            return tuple(spec), None
    return replicated, (
        f"{path or 'parameter'}: shape {tuple(shape)} has no dimension divisible by "
        f"{axis}={size}; replicated"
    )
