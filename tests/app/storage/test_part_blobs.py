"""Stored multi-source parts: the compact array format and the per-row content hashes."""

from __future__ import annotations

import numpy as np

from app.storage.part_blobs import decode_part, encode_part, row_hashes


def test_row_hashes_are_stable_across_versions():
    # Stored in job_segments and job_points: a retry after an upgrade must meet the same
    # values, so the function may never change (a change needs a new digest format).
    columns = [np.arange(6, dtype=np.float64).reshape(2, 3), np.array([1, 2], np.int64)]
    assert row_hashes(columns).tolist() == [10708834682049234970, 6178495800455415863]


def test_row_hashes_tell_rows_dtypes_and_shapes_apart():
    rng = np.random.default_rng(0)
    columns = [rng.random((500, 8)) for _ in range(4)]
    hashes = row_hashes(columns)
    assert len(set(hashes.tolist())) == 500
    changed = [c.copy() for c in columns]
    changed[2][123, 7] = np.nextafter(changed[2][123, 7], 2.0)  # one bit of one value
    assert np.flatnonzero(row_hashes(changed) != hashes).tolist() == [123]
    zeros = np.zeros((2, 2))
    assert row_hashes([zeros])[0] != row_hashes([zeros.astype(np.int64)])[0]
    assert row_hashes([zeros])[0] != row_hashes([zeros.reshape(2, 2, 1)])[0]
    assert row_hashes([np.zeros((3, 3), np.int8)]).shape == (3,)  # rows of 3 bytes: padded
    assert row_hashes([], count=4).tolist() == [0, 0, 0, 0]


def test_a_stacked_part_round_trips():
    part = {"loss": np.arange(12.0).reshape(3, 4), "_weights": np.ones((3, 4), np.float32)}
    back = decode_part(encode_part(part))
    assert list(back) == list(part)
    for name, array in part.items():
        np.testing.assert_array_equal(back[name], array)
        assert back[name].dtype == array.dtype
