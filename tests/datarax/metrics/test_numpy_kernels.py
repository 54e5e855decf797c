"""datarax.metrics._numpy_kernels: the NumPy fast paths answer exactly as NumPy (bit
for bit), which is the condition for keeping them (see ``_numpy_mean``)."""

import numpy as np
import pytest

from datarax.distributed.metrics import reduce_over_devices
from datarax.metrics._numpy_kernels import _numpy_mean, _numpy_sum, _safe_mean
from tests.datarax.support import N, stacked

MEAN_DTYPES = ["float16", "float32", "float64", "int8", "int64", "uint64", "bool", "complex64"]


@pytest.mark.parametrize("dtype", MEAN_DTYPES)
@pytest.mark.parametrize("shape", [(1,), (N,), (17,), (N, 5), (3, 4, 2), (300, 2)], ids=str)
def test_numpy_mean_is_bit_identical_to_np_mean(dtype, shape):
    x = stacked(shape, dtype)
    if dtype.startswith(("float", "complex")):
        x = (x * 1e3).astype(dtype)
        x.flat[0] = np.nan if x.size > 1 else x.flat[0]
    ref = np.mean(x.astype(np.int64) if dtype == "bool" else x, axis=0)
    out = reduce_over_devices(x, "mean")
    assert type(out) is type(ref) and out.dtype == ref.dtype
    assert np.asarray(out).tobytes() == np.asarray(ref).tobytes()


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "bool"])
def test_numpy_mean_kernel_directly(dtype):
    x = stacked((N, 3), dtype)
    ref = np.mean(x, axis=0)
    assert np.asarray(_numpy_mean(x)).tobytes() == np.asarray(ref).tobytes()


INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


@pytest.mark.parametrize("dtype", INT_DTYPES + ["float16", "float32", "float64"])
@pytest.mark.parametrize("shape", [(1,), (N,), (64,), (65,), (N, 5), (300, 2)], ids=str)
def test_checked_sum_and_mean_equal_numpy_where_nothing_overflows(dtype, shape):
    # The overflow checks (Python integers up to 64 devices, bounds beyond) must answer
    # exactly as NumPy wherever NumPy's own answer is right: same type, dtype and bits.
    x = stacked(shape, dtype)
    if dtype.startswith("u"):
        x = np.abs(stacked(shape, "int64")).astype(dtype)
    for checked, reference in ((_numpy_sum, np.sum), (_safe_mean, np.mean)):
        ref = reference(x, axis=0)
        out = checked(x)
        assert type(out) is type(ref) and np.asarray(out).dtype == np.asarray(ref).dtype
        assert np.asarray(out).tobytes() == np.asarray(ref).tobytes(), (checked, dtype, shape)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("devices", [1, 3, 7, 8, 13, 255, 4097], ids=lambda n: f"{n}dev")
def test_float32_division_equals_np_means_float64_division(dtype, devices):
    # _numpy_mean divides a float32 total by a float32 count where np.mean divides in
    # float64 and rounds: every bit pattern (NaN payloads, inf, subnormals, the largest
    # values) must come out the same.
    rng = np.random.default_rng(devices)
    width = np.dtype(dtype).itemsize * 8
    bits = rng.integers(0, 2**width, size=(devices, 4096), dtype=np.uint64)
    x = bits.astype(f"uint{width}").view(dtype)
    with np.errstate(all="ignore"):
        ref = np.mean(x, axis=0)
        out = _numpy_mean(x)
    assert out.dtype == ref.dtype
    assert out.tobytes() == ref.tobytes()


def test_mean_of_an_unaligned_view_equals_np_mean():
    # The service reads npz bodies in place: np.savez's float32 data starts 166 bytes into
    # the body, off a 4-byte boundary, so the kernels see unaligned views.
    x = np.random.default_rng(0).standard_normal((N, 10_001), dtype=np.float32)
    body = b"\0\0" + x.tobytes()
    view = np.frombuffer(body, dtype=np.float32, offset=2).reshape(x.shape)
    assert not view.flags.aligned
    assert _safe_mean(view).tobytes() == np.mean(x, axis=0).tobytes()
