"""The npz writer (datarax.npz) the client and the service share: the archive np.savez
writes, read back by np.load."""

from __future__ import annotations

import io

import numpy as np
import pytest

from datarax.npz import encode_npz


def test_archive_reads_back_with_names_dtypes_and_shapes():
    arrays = {
        "loss": np.arange(6.0).reshape(2, 3),
        "ids": np.array([1, 2, 3], np.int32),
        "scalar": 2.5,
        "naïve": np.zeros((0, 4), np.float16),
    }
    with np.load(io.BytesIO(encode_npz(arrays)), allow_pickle=False) as back:
        assert sorted(back.files) == sorted(arrays)
        for name, value in arrays.items():
            expected = np.asarray(value)
            np.testing.assert_array_equal(back[name], expected)
            assert back[name].dtype == expected.dtype and back[name].shape == expected.shape


def test_object_arrays_are_refused():
    with pytest.raises(TypeError):
        encode_npz({"bad": np.array([{"a": 1}], dtype=object)})
