"""Global arrays from host values (datarax.spmd.global_arrays): this process's row
ranges and slice, and placement with a sharding, on the 8 simulated devices (one process,
so every row is local; the multi-process split is in tests/app/runtime/test_group.py)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from datarax.spmd.global_arrays import (
    global_array_from_host,
    process_local_rows,
    process_local_slice,
)
from tests.datarax.support import N, data_mesh


def test_one_process_holds_every_row_as_one_merged_range():
    mesh = data_mesh()
    split, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    assert process_local_rows(split, (4 * N, 3)) == [(0, 4 * N)]
    assert process_local_rows(replicated, (5,)) == [(0, 5)]
    value = np.arange(4 * N * 3).reshape(4 * N, 3)
    local = process_local_slice(value, split)
    assert np.shares_memory(local, value) and local.shape == value.shape  # a view, no copy


def test_rows_need_at_least_one_dimension():
    with pytest.raises(ValueError, match="at least one dimension"):
        process_local_rows(NamedSharding(data_mesh(), P()), ())


def test_host_value_is_placed_with_the_sharding():
    mesh = data_mesh()
    sharding = NamedSharding(mesh, P("data", None))
    value = np.arange(2 * N * 4, dtype=np.float32).reshape(2 * N, 4)
    placed = global_array_from_host(value, sharding)
    assert isinstance(placed, jax.Array) and placed.sharding.is_equivalent_to(sharding, 2)
    assert {s.data.shape for s in placed.addressable_shards} == {(2, 4)}
    np.testing.assert_array_equal(np.asarray(placed), value)
