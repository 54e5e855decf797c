"""Data-parallel placement: batch shardings, batch and model-state placement, and the
data-parallel training steps and gradient reductions, importable from here as in
upstream datarax.

Defined here: :func:`create_data_parallel_sharding`, :func:`model_state_shardings`,
:func:`place_model_state_on_shards`, :func:`place_nnx_state_on_shards`,
:func:`reduce_gradient_tree`. Re-exported from the modules that own them:
``place_batch_on_shards`` (:mod:`~datarax.spmd.global_arrays`, below
:mod:`~datarax.spmd.multihost` too), ``spmd_train_step`` and ``data_parallel_train_step``
(:mod:`~datarax.spmd.train_step`), ``reduce_gradients_across_devices``
(:mod:`~datarax.spmd.collectives`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, Sharding
from jax.sharding import PartitionSpec as P

from datarax.plan.param_sharding import param_partition_spec
from datarax.spmd.collectives import reduce_gradients_across_devices
from datarax.spmd.global_arrays import global_array_from_host, path_to_str, place_batch_on_shards
from datarax.spmd.train_step import data_parallel_train_step, spmd_train_step
from datarax.tree_types import GradientReduction, PyTree

__all__ = [
    "create_data_parallel_sharding",
    "data_parallel_train_step",
    "model_state_shardings",
    "place_batch_on_shards",
    "place_model_state_on_shards",
    "place_nnx_state_on_shards",
    "reduce_gradient_tree",
    "reduce_gradients_across_devices",
    "spmd_train_step",
]


def create_data_parallel_sharding(mesh: Mesh, data_axis: str = "data") -> NamedSharding:
    """``NamedSharding(mesh, P(data_axis))``: dimension 0 split over ``data_axis``.

    Raises:
      ValueError: ``data_axis`` is not an axis of ``mesh``.
    """
    if data_axis not in mesh.axis_names:
        raise ValueError(
            f"data_axis {data_axis!r} is not an axis of the mesh {dict(mesh.shape)}; "
            f"pass one of {list(mesh.axis_names)}"
        )
    return NamedSharding(mesh, P(data_axis))


def model_state_shardings(
    state: PyTree,
    mesh: Mesh,
    param_sharding: str | Mapping[str, P] | None = None,
) -> tuple[PyTree, list[str]]:
    """The ``NamedSharding`` of every leaf of ``state`` under ``param_sharding``.

    Returns:
      ``(shardings, warnings)``: a pytree of ``NamedSharding`` shaped like ``state``,
      and the rule's warnings for parameters it left replicated.
    """
    axes = {name: int(size) for name, size in mesh.shape.items()}
    warnings: list[str] = []
    if isinstance(param_sharding, Mapping):
        paths = {path_to_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]}
        unknown = sorted(set(param_sharding) - paths)
        if unknown:
            raise ValueError(
                f"param_sharding names paths that are not in the state: {unknown}; "
                f"known paths: {sorted(paths)}"
            )

    def sharding_of(path: Any, leaf: Any) -> NamedSharding:
        name = path_to_str(path)
        if param_sharding is None or isinstance(param_sharding, str):
            rule = param_sharding or "replicate"
            shape = tuple(np.shape(leaf))
            entries, warning = param_partition_spec(shape, axes, rule, name)
            if warning:
                warnings.append(warning)
            return NamedSharding(mesh, P(*entries))
        spec = param_sharding.get(name, P())
        return NamedSharding(mesh, spec if isinstance(spec, P) else P(*spec))

    shardings = jax.tree_util.tree_map_with_path(sharding_of, state)
    return shardings, warnings


def place_model_state_on_shards(
    state: PyTree,
    mesh: Mesh,
    param_sharding: str | Mapping[str, P] | None = None,
) -> PyTree:
    """Places model (or optimizer) state on ``mesh``; replicated by default.

    Args:
      state: an ``nnx.State`` (``nnx.state(model)``) or any pytree of arrays.
      mesh: the device mesh.
      param_sharding: ``None`` or ``"replicate"`` (every device holds everything),
        ``"model"`` or ``"fsdp"`` (rules of :mod:`datarax.distributed.sharding`), or a
        dict ``{"layers/0/kernel": P(None, "model"), ...}`` by parameter path; paths not
        in the dict are replicated, and a path not in ``state`` is a ``ValueError``.

    Returns:
      The same structure (an ``nnx.State`` stays one) with every array a ``jax.Array``
      placed with its ``NamedSharding``. Apply it to a model with
      ``nnx.update(model, sharded_state)``. On a mesh spanning processes every process
      passes the same state and fills only the shards its devices hold.

    Raises:
      ValueError: an unknown rule name or a dict naming unknown paths.
    """
    shardings, _ = model_state_shardings(state, mesh, param_sharding)
    # One process: device_put. Several: every process holds the same state (same seed,
    # same code) and fills only its own shards, with no cross-process traffic.
    placed: PyTree = jax.tree.map(global_array_from_host, state, shardings)
    return placed


def place_nnx_state_on_shards(
    state: nnx.State[Any, Any],
    mesh: Mesh,
    filter_sharding: nnx.StateSharding | Mapping[Any, P | Sharding],
) -> nnx.State[Any, Any]:
    """Places an NNX state with shardings chosen by NNX filters (upstream's API).

    Each variable takes the sharding of the first filter that matches it, as
    ``nnx.StateSharding`` matches (``nnx.Param``, ``"kernel"``, a path predicate, ``...``
    for everything else). A ``PartitionSpec`` is taken on ``mesh``; a ``Sharding`` is used
    as given. Works on a mesh spanning processes too (each process fills its own shards).

    Args:
      state: ``nnx.state(model)`` or a sub-state, e.g. ``kernel [F, H] float32``.
      mesh: the device mesh the specs refer to.
      filter_sharding: ``{nnx.Param: P(None, "model"), ...: P()}`` or an
        ``nnx.StateSharding``.

    Returns:
      An ``nnx.State`` of the same structure, every variable holding a ``jax.Array``
      placed with its sharding (``kernel [F, H]`` sharded over 'model' above). Apply it
      with ``nnx.update(model, placed)``.

    Raises:
      ValueError: a variable no filter matches (the message names its path and the
        filters; add ``...: P()`` to replicate the rest), or a spec naming an axis
        ``mesh`` lacks.
    """
    rules = (
        filter_sharding
        if isinstance(filter_sharding, nnx.StateSharding)
        else nnx.StateSharding(filter_sharding)
    )
    placed = []
    for path, variable in nnx.to_flat_state(state):
        try:
            target = rules.map_prefix(path, variable)
        except ValueError as err:
            raise ValueError(
                f"no filter of {list(rules.filters)} matches the variable at "
                f"{'/'.join(map(str, path))!r} ({type(variable).__name__}); add a catch-all "
                "entry such as `...: PartitionSpec()` to replicate the rest"
            ) from err
        sharding = target if isinstance(target, Sharding) else NamedSharding(mesh, P(*target))
        value = global_array_from_host(variable[...], sharding)
        placed.append((path, variable.replace(value=value)))
    return nnx.from_flat_state(placed)


def reduce_gradient_tree(gradients: PyTree, reduce_type: GradientReduction = "mean") -> PyTree:
    """Reduces every gradient leaf to a scalar with ``jnp.mean`` or ``jnp.sum``.

    The SPMD counterpart of ``reduce_gradients_across_devices``: it works on global
    arrays, inside ``nnx.jit`` under a mesh (XLA does the cross-device part) or eagerly.
    Each leaf is reduced over *all* its elements, as upstream datarax does, e.g. a
    ``[F, H]`` float32 gradient becomes a ``[]`` float32 scalar.

    Args:
      gradients: pytree of arrays.
      reduce_type: ``"mean"`` or ``"sum"`` (any case).

    Returns:
      The same structure with 0-d ``jax.Array`` leaves.

    Raises:
      ValueError: another ``reduce_type`` (message starts "Unsupported reduce_type").
    """
    kind = reduce_type.lower() if isinstance(reduce_type, str) else reduce_type
    if kind == "mean":
        means: PyTree = jax.tree.map(jnp.mean, gradients)
        return means
    if kind == "sum":
        sums: PyTree = jax.tree.map(jnp.sum, gradients)
        return sums
    raise ValueError(
        f"Unsupported reduce_type {reduce_type!r}: reduce_type must be 'mean' or 'sum'"
    )
