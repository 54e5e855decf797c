"""Data-parallel placement: batch shardings, batch and model-state placement, gradient
reduction inside collective contexts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from datarax.distributed.planning import nearest_valid_sizes
from datarax.distributed.sharding import param_partition_spec, path_to_str

PyTree = Any


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


def _is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray | jax.Array)


def _dim0_shards(sharding: NamedSharding) -> int:
    spec = sharding.spec
    if len(spec) == 0 or spec[0] is None:
        return 1
    names = spec[0] if isinstance(spec[0], tuple) else (spec[0],)
    return int(np.prod([sharding.mesh.shape[n] for n in names]))


def _local_dim0_blocks(sharding: NamedSharding, shards: int) -> int:
    """How many distinct dimension-0 shards this process's devices hold."""
    index_map = sharding.addressable_devices_indices_map((shards,))
    return len({idx[0].start or 0 for idx in index_map.values()})


def place_batch_on_shards(batch: PyTree, sharding: NamedSharding) -> PyTree:
    """Places every array leaf of ``batch`` with ``sharding``.

    Leaves that are ``np.ndarray`` or ``jax.Array`` are placed; other leaves (strings,
    ints, None) pass through. 0-d arrays are replicated. In a multi-process runtime
    (``sharding`` spans devices of other processes) each process passes its own rows of
    the batch (the rows its devices hold, in order) and the leaves become global arrays
    through ``jax.make_array_from_process_local_data``: the global leading dimension is
    the local one times ``shards / shards held here``, so a replicated batch stays whole.
    To give every process the whole batch instead, use
    ``datarax.distributed.multihost.place_global_batch``.

    Args:
      batch: a pytree, e.g. ``{"inputs": [B, F] float32, "targets": [B] int32}``.
      sharding: usually ``create_data_parallel_sharding(mesh)``.

    Returns:
      The same pytree with array leaves as ``jax.Array``s, e.g. ``inputs: [B, F] sharded
      over 'data'``.

    Raises:
      ValueError: a leaf whose leading dimension does not split into the shard count
        (the message names the leaf, its shape, the count and the nearest valid sizes).
    """
    shards = _dim0_shards(sharding)
    multi_process = not sharding.is_fully_addressable
    local_blocks = _local_dim0_blocks(sharding, shards) if multi_process else shards
    replicated = NamedSharding(sharding.mesh, P())

    def place(path: Any, leaf: Any) -> Any:
        if not _is_array(leaf):
            return leaf
        if leaf.ndim == 0:
            return jax.device_put(leaf, replicated)
        rows = leaf.shape[0]
        if rows % local_blocks:
            low, high = nearest_valid_sizes(rows, local_blocks)
            where = "process-local " if multi_process else ""
            raise ValueError(
                f"batch leaf {path_to_str(path) or '<root>'!r} has shape {tuple(leaf.shape)}: "
                f"{where}leading dimension {rows} is not divisible by {local_blocks} shards; "
                f"nearest valid sizes: {low} or {high}"
            )
        if multi_process:
            global_shape = (rows // local_blocks * shards, *leaf.shape[1:])
            return jax.make_array_from_process_local_data(sharding, np.asarray(leaf), global_shape)
        return jax.device_put(leaf, sharding)

    return jax.tree_util.tree_map_with_path(place, batch)


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
    from datarax.distributed.multihost import global_array_from_host

    shardings, _ = model_state_shardings(state, mesh, param_sharding)
    # One process: device_put. Several: every process holds the same state (same seed,
    # same code) and fills only its own shards, with no cross-process traffic.
    return jax.tree.map(global_array_from_host, state, shardings)


def reduce_gradients_across_devices(
    grads: PyTree, reduce_type: str = "mean", axis_name: str = "batch"
) -> PyTree:
    """All-reduces ``grads`` over ``axis_name``: ``lax.pmean`` or ``lax.psum``.

    Only valid inside a collective context that binds ``axis_name`` (``jax.pmap``,
    ``jax.shard_map``, :func:`datarax.distributed.collective_pmap`). Under ``nnx.jit``
    with a sharded batch the compiler already all-reduces; do not call this there.

    Raises:
      ValueError: ``reduce_type`` other than ``"mean"`` or ``"sum"``.
    """
    if reduce_type == "mean":
        return jax.tree.map(lambda g: lax.pmean(g, axis_name), grads)
    if reduce_type == "sum":
        return jax.tree.map(lambda g: lax.psum(g, axis_name), grads)
    raise ValueError(f"reduce_type must be 'mean' or 'sum', got {reduce_type!r}")
