"""Host data to global arrays: which rows of a batch this process holds, and arrays built
from values every process has. Works alike in one process (then it is ``device_put``) and
in a multi-process group.

Below both :mod:`datarax.distributed.data_parallel` (placement) and
:mod:`datarax.spmd.multihost` (the multi-host helpers, which re-export these
names), so neither imports the other's internals.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Sharding

__all__ = ["global_array_from_host", "process_local_rows", "process_local_slice"]


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
