"""Collective reductions: ``lax.pmean`` / ``psum`` / ``all_gather`` over every leaf of a
pytree, valid only inside ``jax.pmap`` or ``jax.shard_map`` (or
:func:`datarax.distributed.collective_pmap`) with a matching ``axis_name``.

Under ``nnx.jit`` with a sharded batch XLA inserts the all-reduce itself; use the SPMD
``reduce_*`` functions of :mod:`datarax.distributed.metrics` there instead.

As in upstream datarax, ``jax.lax`` is looked up when a collective is called (so a test
may patch ``jax.lax.pmean``), and only ``jax.Array`` leaves (tracers included) take part:
Python and NumPy scalars, NumPy arrays captured as constants, strings and ``None`` pass
through unchanged.
"""

from __future__ import annotations

from typing import Any

import jax

from datarax.errors import UnboundAxisError
from datarax.tree_types import GradientReduction, PyTree

__all__ = [
    "all_gather",
    "reduce_gradients_across_devices",
    "reduce_mean_collective",
    "reduce_sum_collective",
]

_GRADIENT_REDUCTIONS = ("mean", "sum")


def _check_axis_name(axis_name: Any) -> None:
    if not isinstance(axis_name, str) or not axis_name:
        raise UnboundAxisError(
            "unbound_axis_name",
            f"axis_name must be a non-empty string, got {axis_name!r}; use the name given "
            'to jax.pmap(..., axis_name=...) or the mesh axis of shard_map (e.g. "batch").',
        )


def _map_collective(
    lax_name: str, tree: PyTree, axis_name: str, what: str, **kwargs: Any
) -> PyTree:
    """Applies ``jax.lax.<lax_name>`` to every ``jax.Array`` leaf of ``tree``."""
    _check_axis_name(axis_name)

    def one(x: Any) -> Any:
        if isinstance(x, jax.Array):
            return getattr(jax.lax, lax_name)(x, axis_name, **kwargs)
        return x

    try:
        mapped: PyTree = jax.tree_util.tree_map(one, tree, is_leaf=lambda x: x is None)
        return mapped
    except UnboundAxisError:
        raise
    except NameError as err:
        raise UnboundAxisError(
            "unbound_axis_name",
            f"{what} found no mapped axis named {axis_name!r} ({err}); call it inside "
            f"jax.pmap(..., axis_name={axis_name!r}) or jax.shard_map over a mesh with that "
            "axis, or use the SPMD reduce_* functions under jit.",
        ) from err


def reduce_mean_collective(metrics: PyTree, axis_name: str = "batch") -> PyTree:
    """``lax.pmean`` of every array leaf over a mapped axis (inside ``pmap``/``shard_map``).

    Args:
      metrics: pytree of per-device values of any shape ``[...]``, e.g. gradients.
      axis_name: the ``pmap`` axis name or ``shard_map`` mesh axis, e.g. ``"batch"``.

    Returns:
      Same structure and shapes, each ``jax.Array`` leaf averaged over ``axis_name``
      (identical on every device). Other leaves pass through.

    Raises:
      UnboundAxisError: code ``unbound_axis_name`` (a ``MetricsError`` and a
        ``NameError``) when called outside a context binding ``axis_name``.

    Example:
      >>> jax.pmap(lambda x: reduce_mean_collective(x, "batch"), axis_name="batch")(
      ...     jnp.arange(8.0))  # doctest: +SKIP
      Array([3.5, 3.5, 3.5, 3.5, 3.5, 3.5, 3.5, 3.5], dtype=float32)
    """
    return _map_collective("pmean", metrics, axis_name, "reduce_mean_collective")


def reduce_sum_collective(metrics: PyTree, axis_name: str = "batch") -> PyTree:
    """``lax.psum`` of every array leaf over a mapped axis; see
    :func:`reduce_mean_collective` (same arguments and errors)."""
    return _map_collective("psum", metrics, axis_name, "reduce_sum_collective")


def all_gather(metrics: PyTree, axis_name: str = "batch") -> PyTree:
    """``lax.all_gather`` of every array leaf over a mapped axis (inside
    ``pmap``/``shard_map``).

    Args:
      metrics: pytree of per-device values ``[...]``.
      axis_name: the ``pmap`` axis name or ``shard_map`` mesh axis.

    Returns:
      Same structure, each ``jax.Array`` leaf ``[axis_size, ...]`` holding every device's
      value, marked invariant over ``axis_name`` (so ``shard_map(..., out_specs=P())``
      accepts it). Other leaves pass through.

    Raises:
      UnboundAxisError: code ``unbound_axis_name`` outside a context binding it.
    """
    # to="invarying" marks the result as equal on every device, so shard_map's
    # replication check accepts out_specs=P(); plain all_gather stays "varying".
    return _map_collective("all_gather", metrics, axis_name, "all_gather", to="invarying")


def reduce_gradients_across_devices(
    gradients: PyTree, reduce_type: GradientReduction = "mean", axis_name: str = "batch"
) -> PyTree:
    """All-reduces a gradient pytree over ``axis_name``: ``lax.pmean`` or ``lax.psum``.

    The gradient form of :func:`reduce_mean_collective` / :func:`reduce_sum_collective`.
    Only valid inside a collective context that binds ``axis_name`` (``jax.pmap``,
    ``jax.shard_map``, :func:`datarax.distributed.collective_pmap`). Under ``nnx.jit``
    with a sharded batch the compiler already all-reduces; do not call this there.

    Args:
      gradients: pytree of per-device gradients, e.g. an ``nnx.State`` of ``[...]``
        float32 leaves.
      reduce_type: ``"mean"`` or ``"sum"`` (any case, as upstream accepts).
      axis_name: the collective axis name.

    Returns:
      The same structure with every ``jax.Array`` leaf reduced over ``axis_name``.

    Raises:
      ValueError: ``reduce_type`` other than mean or sum (message starts "Unsupported
        reduce_type", upstream's wording).
      UnboundAxisError: called outside a context binding ``axis_name``.
    """
    kind = reduce_type.lower() if isinstance(reduce_type, str) else reduce_type
    if kind not in _GRADIENT_REDUCTIONS:
        raise ValueError(
            f"Unsupported reduce_type {reduce_type!r}: reduce_type must be 'mean' or 'sum'"
        )
    if kind == "mean":
        return _map_collective("pmean", gradients, axis_name, "reduce_gradients_across_devices")
    return _map_collective("psum", gradients, axis_name, "reduce_gradients_across_devices")
