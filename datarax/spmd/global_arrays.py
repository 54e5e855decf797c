"""Host data to global arrays: which rows of a batch this process holds, batches placed
on their shards, and arrays built from values every process has. Works alike in one
process (then it is ``device_put``) and in a multi-process group.

Below both :mod:`datarax.distributed.data_parallel` (placement, which re-exports
:func:`place_batch_on_shards` at upstream's path) and :mod:`datarax.spmd.multihost` (the
multi-host helpers, which re-export the row and array helpers), so neither imports the
other. :func:`dim0_shard_count` and :func:`path_to_str` are re-exported by
:mod:`datarax.distributed.sharding` too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, Sharding
from jax.sharding import PartitionSpec as P

from datarax.plan.layout import nearest_valid_sizes
from datarax.tree_types import PyTree

__all__ = [
    "dim0_shard_count",
    "global_array_from_host",
    "path_to_str",
    "place_batch_on_shards",
    "process_local_rows",
    "process_local_slice",
]


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


def dim0_shard_count(sharding: NamedSharding) -> int:
    """How many blocks dimension 0 is split into under ``sharding``.

    ``P("data")`` on ``{"data": 4, "model": 2}`` gives 4, ``P(("data", "model"))`` gives 8,
    ``P()`` or ``P(None, "model")`` gives 1.

    Raises:
      ValueError: ``sharding`` is not a ``NamedSharding``.
    """
    if not isinstance(sharding, NamedSharding):
        raise ValueError(
            f"dim0_shard_count needs a NamedSharding, got {type(sharding).__name__}; "
            "build one with NamedSharding(mesh, P('data'))"
        )
    spec = sharding.spec
    if len(spec) == 0 or spec[0] is None:
        return 1
    names = spec[0] if isinstance(spec[0], tuple) else (spec[0],)
    return math.prod(int(sharding.mesh.shape[name]) for name in names)


def process_local_rows(sharding: Sharding, global_shape: Sequence[int]) -> list[tuple[int, int]]:
    """The ``[start, stop)`` row ranges of dimension 0 that this process's devices hold.

    Sorted, with adjacent device blocks merged; concatenated in this order they are the
    local data ``jax.make_array_from_process_local_data`` expects. A batch replicated
    over dimension 0 gives one range with all rows.

    Args:
      sharding: the global array's sharding (may span several processes).
      global_shape: the global array's shape, at least 1-d.

    Returns:
      E.g. ``[(0, 16)]`` on process 0 and ``[(16, 32)]`` on process 1 for 32 rows split
      over ``data=8`` across two processes of four devices each.

    Raises:
      ValueError: ``global_shape`` is 0-d.
    """
    shape = tuple(int(d) for d in global_shape)
    if not shape:
        raise ValueError("process_local_rows needs an array of at least one dimension")
    blocks = set()
    for index in sharding.addressable_devices_indices_map(shape).values():
        rows = index[0] if index else slice(None)
        start, stop, _ = rows.indices(shape[0])
        blocks.add((start, stop))
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(blocks):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(stop, merged[-1][1]))
        else:
            merged.append((start, stop))
    return merged


def process_local_slice(value: np.ndarray, sharding: Sharding) -> np.ndarray:
    """The rows of the global host array ``value`` that this process's devices hold.

    A view when they are one contiguous block (the usual case), a copy otherwise.
    """
    blocks = process_local_rows(sharding, value.shape)
    if len(blocks) == 1:
        start, stop = blocks[0]
        return value[start:stop]
    return np.concatenate([value[start:stop] for start, stop in blocks])


def global_array_from_host(value: jax.typing.ArrayLike, sharding: Sharding) -> jax.Array:
    """A global array from a value that is identical on every process.

    ``jax.device_put`` onto a sharding that spans processes first checks, with a
    collective, that the value is equal everywhere (``multihost_utils.assert_equal``):
    one all-gather per array. Here each process fills its own shards from its copy
    (``jax.make_array_from_callback``) and nothing crosses processes: the caller promises
    the values agree (same seed, same code). Global arrays that are already on the same
    devices are resharded with ``device_put``.

    Args:
      value: host value (numpy, scalar) or a process-local ``jax.Array``, any shape.
      sharding: target sharding.

    Returns:
      ``jax.Array`` with ``sharding``, shape and dtype of ``value``.
    """
    if sharding.is_fully_addressable or (
        isinstance(value, jax.Array) and not value.is_fully_addressable
    ):
        placed: jax.Array = jax.device_put(value, sharding)
        return placed
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def _is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray | jax.Array)


def _local_dim0_blocks(sharding: NamedSharding, shards: int) -> int:
    """How many distinct dimension-0 shards this process's devices hold."""
    index_map = sharding.addressable_devices_indices_map((shards,))
    # None: the device holds the whole array, i.e. the block that starts at 0
    return len({0 if idx is None else idx[0].start or 0 for idx in index_map.values()})


def place_batch_on_shards(batch: PyTree, sharding: NamedSharding) -> PyTree:
    """Places every array leaf of ``batch`` with ``sharding``.

    Leaves that are ``np.ndarray`` or ``jax.Array`` are placed; other leaves (strings,
    ints, None) pass through. 0-d arrays are replicated. In a multi-process runtime
    (``sharding`` spans devices of other processes) each process passes its own rows of
    the batch (the rows its devices hold, in order) and the leaves become global arrays
    through ``jax.make_array_from_process_local_data``: the global leading dimension is
    the local one times ``shards / shards held here``, so a replicated batch stays whole.
    To give every process the whole batch instead, use
    :func:`datarax.spmd.multihost.place_global_batch`.

    Args:
      batch: a pytree, e.g. ``{"inputs": [B, F] float32, "targets": [B] int32}``.
      sharding: usually ``datarax.distributed.create_data_parallel_sharding(mesh)``.

    Returns:
      The same pytree with array leaves as ``jax.Array``s, e.g. ``inputs: [B, F] sharded
      over 'data'``.

    Raises:
      ValueError: a leaf whose leading dimension does not split into the shard count
        (the message names the leaf, its shape, the count and the nearest valid sizes).
    """
    shards = dim0_shard_count(sharding)
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
                + (
                    f"nearest valid size: {low}"
                    if low == high
                    else f"nearest valid sizes: {low} or {high}"
                )
            )
        if multi_process:
            global_shape = (rows // local_blocks * shards, *leaf.shape[1:])
            return jax.make_array_from_process_local_data(sharding, np.asarray(leaf), global_shape)
        return jax.device_put(leaf, sharding)

    placed: PyTree = jax.tree_util.tree_map_with_path(place, batch)
    return placed
