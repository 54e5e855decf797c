"""Decoders never hand numpy a shape it cannot hold, a dtype JSON cannot answer, or a
member name that is not the array's (issue 26). JSON tensors and npz members (stored and
deflated) share one shape check; each refusal is a ServiceError with its code."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from app.codecs.json_arrays import MAX_EMPTY_EXTENT, check_array_shape, decode_json_arrays
from app.codecs.npz import load_npz
from app.core.errors import InvalidNpz, InvalidTensor, UnsupportedDatatype

# (id, shape): each numpy refuses (or would answer out of proportion) with no data sent.
BAD_SHAPES = [
    ("sizes-past-2**63", [0, 2**62, 2**62]),
    ("one-size-past-2**63-bytes", [0, 2**61]),  # 2**61 float64 = 2**64 bytes
    ("65-zero-dims", [0] * 65),
    ("65-one-dims", [1] * 65),
    ("empty-but-huge", [1, 2**40, 0]),
    ("empty-just-past-the-cap", [0, MAX_EMPTY_EXTENT + 1]),
]


@pytest.mark.parametrize(("shape"), [s for _, s in BAD_SHAPES], ids=[i for i, _ in BAD_SHAPES])
def test_json_tensors_with_impossible_shapes_are_invalid_tensor(shape):
    size = 1 if all(shape) else 0
    tensor = {"shape": shape, "datatype": "FP64", "data": [1.0] * size}
    with pytest.raises(InvalidTensor) as info:
        decode_json_arrays({"loss": tensor})
    assert info.value.code == "invalid_tensor" and "'loss'" in info.value.detail


@pytest.mark.parametrize(
    "shape", [[1] * 64, [0, MAX_EMPTY_EXTENT], [2, 0], [0]], ids=["64-dims", "cap", "2x0", "0"]
)
def test_shapes_at_the_limits_are_accepted(shape):
    size = 1 if all(shape) else 0
    out = decode_json_arrays({"x": {"shape": shape, "datatype": "FP32", "data": [1.0] * size}})
    assert out["x"].shape == tuple(shape)


def test_uint64_tensors_keep_their_full_range():
    out = decode_json_arrays({"u": {"shape": [2], "datatype": "UINT64", "data": [2**64 - 1, 1]}})
    assert out["u"].dtype == np.uint64 and out["u"].tolist() == [2**64 - 1, 1]
    with pytest.raises(InvalidTensor, match="do not fit UINT64"):
        decode_json_arrays({"u": {"shape": [2], "datatype": "UINT64", "data": [2**64, 1]}})
    with pytest.raises(InvalidTensor, match="do not fit INT64"):
        decode_json_arrays({"i": {"shape": [2], "datatype": "INT64", "data": [2**63, 1]}})
    with pytest.raises(InvalidTensor, match="non-integer"):
        decode_json_arrays({"u": {"shape": [2], "datatype": "UINT64", "data": [2**64 - 1, 0.5]}})


def test_check_array_shape_names_the_rule():
    with pytest.raises(InvalidTensor, match="65 dimensions; arrays have at most 64"):
        check_array_shape("npz array", "x", (1,) * 65, 8)
    with pytest.raises(InvalidTensor, match=r"\(20 sizes\)"):  # long shapes are abridged
        check_array_shape("metric", "x", [0] + [2**10] * 19, 8)
    check_array_shape("metric", "x", [2**20, 2**20], 8)  # 8 TiB claimed: bounded elsewhere


# ------------------------------------------------------------------------------- npz


def _npz_with_header(shape, *, descr="<f8", compress=zipfile.ZIP_STORED, name="loss.npy"):
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": descr, "fortran_order": False, "shape": tuple(shape)}
    )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compress) as archive:
        archive.writestr(name, header.getvalue())  # no data: only a zero size is honest
    return buffer.getvalue()


@pytest.mark.parametrize(
    "compress", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED], ids=["stored", "deflated"]
)
@pytest.mark.parametrize(("shape"), [s for _, s in BAD_SHAPES], ids=[i for i, _ in BAD_SHAPES])
def test_npz_members_with_impossible_shapes_are_refused(shape, compress):
    body = _npz_with_header(shape, compress=compress)
    with pytest.raises((InvalidTensor, InvalidNpz)) as info:
        load_npz(body, max_bytes=1 << 20)
    assert info.value.code in {"invalid_tensor", "invalid_npz"}, info.value.detail


def _savez(compressed=False, **arrays) -> bytes:
    buffer = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buffer, **arrays)
    return buffer.getvalue()


@pytest.mark.parametrize("compressed", [False, True], ids=["stored", "deflated"])
@pytest.mark.parametrize(
    "dtype", ["longdouble", "clongdouble", "complex128", "<U3", "datetime64[s]"], ids=str
)
def test_npz_dtypes_json_cannot_answer_are_unsupported(dtype, compressed):
    if np.dtype(dtype).itemsize <= 8 and np.dtype(dtype).kind == "f":
        pytest.skip(f"{dtype} is float64 on this platform")  # never on x86-64 Linux
    body = _savez(compressed, x=np.zeros(2, dtype=dtype))
    with pytest.raises(UnsupportedDatatype) as info:
        load_npz(body, max_bytes=1 << 20)
    assert info.value.code == "unsupported_datatype" and "'x'" in info.value.detail


def _renamed(body: bytes, old: bytes, new: bytes) -> bytes:
    """The archive with a member name patched in place (local and central headers)."""
    assert len(old) == len(new) and body.count(old) == 2
    return body.replace(old, new)


@pytest.mark.parametrize("compressed", [False, True], ids=["stored", "deflated"])
@pytest.mark.parametrize(
    "name",
    [b"a\x00b.npy", b"\x00ab.npy", b"a\x01b.npy", b"a\nb.npy", b"a\x7fb.npy", b"a\x1bb.npy"],
    ids=["nul", "leading-nul", "soh", "newline", "del", "escape"],
)
def test_npz_member_names_with_control_characters_are_invalid(name, compressed):
    body = _renamed(_savez(compressed, aXb=np.array([1.0, 2.0])), b"aXb.npy", name)
    with pytest.raises(InvalidNpz, match="NUL or control character"):
        load_npz(body, max_bytes=1 << 20)


@pytest.mark.parametrize("compressed", [False, True], ids=["stored", "deflated"])
def test_npz_duplicate_member_names_are_invalid(compressed):
    body = _savez(compressed, aXb=np.array([1.0]), aYb=np.array([2.0]))
    body = body.replace(b"aYb.npy", b"aXb.npy")
    with pytest.raises(InvalidNpz, match="appears twice"):
        load_npz(body, max_bytes=1 << 20)


def test_npz_printable_unicode_names_still_load():
    out = load_npz(_savez(**{"verlust_é": np.array([1.0])}), max_bytes=1 << 20)
    assert list(out) == ["verlust_é"]
