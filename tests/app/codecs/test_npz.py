"""npz codec: read without pickle, in place when stored; written as np.savez writes it."""

from __future__ import annotations

import io

import numpy as np
import pytest

from app.codecs.npz import encode_npz, load_npz
from app.core.errors import InvalidNpz, PayloadTooLarge, UnsupportedDatatype


def _savez(compressed: bool = False, **arrays) -> bytes:
    buffer = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buffer, **arrays)
    return buffer.getvalue()


@pytest.mark.parametrize("compressed", [False, True], ids=["stored", "deflated"])
def test_round_trip(compressed):
    arrays = {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.array([True, False])}
    out = load_npz(_savez(compressed, **arrays), max_bytes=1 << 20)
    for name, value in arrays.items():
        np.testing.assert_array_equal(out[name], value)
        assert out[name].dtype == value.dtype


def test_stored_arrays_are_views_into_the_body():
    body = _savez(a=np.arange(1000, dtype=np.int64))
    out = load_npz(body, max_bytes=1 << 20)
    assert not out["a"].flags.owndata and not out["a"].flags.writeable


def test_encode_npz_is_read_by_numpy():
    blob = encode_npz({"loss": np.float32(1.5), "per": np.arange(3), "é": np.ones(2)})
    with np.load(io.BytesIO(blob), allow_pickle=False) as npz:
        assert npz["loss"].shape == () and npz["loss"] == np.float32(1.5)
        assert npz["per"].tolist() == [0, 1, 2] and npz["é"].tolist() == [1.0, 1.0]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"", InvalidNpz),
        (b"not a zip", InvalidNpz),
        (_savez(x=np.array(["a"], dtype=object)), InvalidNpz),
        (_savez(x=np.array([1 + 2j])), UnsupportedDatatype),
        (_savez(x=np.zeros(1 << 16)), PayloadTooLarge),
    ],
    ids=["empty", "not-zip", "object", "complex", "inflates-past-limit"],
)
def test_refusals(body, error):
    with pytest.raises(error):
        load_npz(body, max_bytes=1 << 16)
