"""datarax.spmd.multihost in one process: argument checks before JAX is touched,
and the global-array helpers, which must work alike with one process and many.

Across real processes these functions run inside the service's runtimes:
``tests/app/runtime/test_group.py``.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from datarax.spmd import multihost as dmh


def test_initialize_distributed_validates_before_touching_jax():
    assert dmh.initialize_distributed() is False  # single process: nothing to do
    with pytest.raises(ValueError, match="together"):
        dmh.initialize_distributed("h:1", 2)
    with pytest.raises(ValueError, match="process_id"):
        dmh.initialize_distributed("h:1", 2, 5)
    with pytest.raises(ValueError, match="heartbeat"):
        dmh.initialize_distributed("h:1", 2, 0, heartbeat_timeout_s=0)


def test_process_local_rows_in_one_process(eight_devices):
    mesh = jax.make_mesh((2, 4), ("data", "model"), devices=eight_devices)
    sharded = NamedSharding(mesh, P("data"))
    assert dmh.process_local_rows(sharded, (8, 3)) == [(0, 8)]  # both blocks are here
    assert dmh.process_local_rows(NamedSharding(mesh, P()), (8, 3)) == [(0, 8)]
    value = np.arange(24.0).reshape(8, 3)
    np.testing.assert_array_equal(dmh.process_local_slice(value, sharded), value)


def test_global_batches_round_trip_in_one_process(eight_devices):
    mesh = jax.make_mesh((2, 4), ("data", "model"), devices=eight_devices)
    sharded = NamedSharding(mesh, P("data"))
    value = np.arange(24.0).reshape(8, 3)
    placed = dmh.place_global_batch({"x": value, "n": np.array(2.0), "tag": "t"}, sharded)
    assert placed["x"].sharding == sharded and placed["tag"] == "t"
    assert {s.data.shape for s in placed["x"].addressable_shards} == {(4, 3)}
    np.testing.assert_array_equal(dmh.fetch_global(placed["x"]), value)
    assert dmh.fetch_global(placed["n"]) == 2
    assert dmh.owns_devices_of(mesh)
    with pytest.raises(ValueError, match="divisible"):
        dmh.place_global_batch({"x": np.zeros((3, 2))}, sharded)
