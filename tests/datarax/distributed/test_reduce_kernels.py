"""datarax.distributed._reduce_kernels: the NumPy fast paths answer exactly as NumPy
(bit for bit), which is the condition for keeping them (see ``_numpy_mean``)."""

import numpy as np
import pytest

from datarax.distributed._reduce_kernels import _numpy_mean, _numpy_sum, _safe_mean
from datarax.distributed.metrics import reduce_custom, reduce_over_devices
from tests.datarax.support import N, stacked

NP_OPS = {"mean": np.mean, "sum": np.sum, "max": np.max, "min": np.min}

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


def test_flat_dict_reduction_matches_the_tree_path():
    flat = {"b": stacked((N, 3), "float32"), "a": stacked((N,), "int32"), "": np.float32(2)}
    ops = {"a": "max", "b": "sum"}
    fast = reduce_custom(flat, ops)
    tree = reduce_custom({k: {"leaf": v} for k, v in flat.items()}, ops)
    assert list(fast) == list(flat)
    for name, value in fast.items():
        assert np.asarray(value).tobytes() == np.asarray(tree[name]["leaf"]).tobytes()


@pytest.mark.parametrize("op", ["mean", "sum", "max", "min"])
@pytest.mark.parametrize("nan_policy", ["propagate", "omit"])
def test_flat_dict_fast_path_is_bit_identical_to_numpy(op, nan_policy):
    # reduce_custom's {str: ndarray} path calls the ufunc reductions directly for
    # unweighted propagate; every dtype must still answer exactly as numpy (bool as int).
    metrics = {
        dtype: stacked(shape, dtype)
        for dtype in ("float64", "float32", "float16", "int32", "uint8", "bool")
        for shape in [(N,)]
    } | {"f64_2d": stacked((N, 3), "float64"), "i64_2d": stacked((N, 2), "int64")}
    out = reduce_custom(metrics, dict.fromkeys(metrics, op), nan_policy=nan_policy)
    assert list(out) == list(metrics)
    for name, x in metrics.items():
        ref = NP_OPS[op](x.astype(np.int64) if x.dtype == np.bool_ else x, axis=0)
        got = out[name]
        assert type(got) is type(ref), name
        assert np.asarray(got).dtype == np.asarray(ref).dtype, name
        assert np.asarray(got).tobytes() == np.asarray(ref).tobytes(), name


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
