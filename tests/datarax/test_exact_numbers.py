"""Numbers that never wrap (issue 26): integer reductions are exact or refused
(``integer_overflow``), float sums and means are finite wherever the true result is, and
weighted means do not depend on the weights' scale. Every integer dtype, every op, NumPy
and JAX, the small (Python integer) and large (bounds, then split) paths; checked against
Python's exact integers and fractions."""

from __future__ import annotations

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from datarax.distributed.metrics import (
    reduce_custom,
    reduce_mean,
    reduce_over_devices,
    reduce_sum,
)
from datarax.metrics._exact_reductions import (
    int_mean_exact,
    int_sum_exact,
    int_sum_may_overflow,
    scaled_mean,
    scaled_sum,
)
from tests.datarax.support import assert_metrics_error

INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
SMALL, LARGE = 8, 100  # devices: the Python-integer path (<= 64) and the array path
I64_MAX, I64_MIN, U64_MAX = 2**63 - 1, -(2**63), 2**64 - 1


def _extreme(dtype: str, devices: int, width: int = 0) -> np.ndarray:
    """Every device holds the dtype's maximum (``[devices]`` or ``[devices, width]``)."""
    shape = (devices,) if not width else (devices, width)
    return np.full(shape, np.iinfo(dtype).max, dtype=dtype)


# ------------------------------------------------------------------ integer sums


@pytest.mark.parametrize("devices", [SMALL, LARGE], ids=["small", "large"])
@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_integer_sums_are_exact_or_refused_for_every_dtype(dtype, devices):
    x = _extreme(dtype, devices)
    exact = devices * int(np.iinfo(dtype).max)
    acc_max = I64_MAX if dtype.startswith("int") else U64_MAX
    if exact <= acc_max:  # int8..int32, uint8..uint32: numpy sums in 64 bits
        out = reduce_over_devices(x, "sum")
        assert int(out) == exact and out.dtype.itemsize == 8
        return
    err = assert_metrics_error("integer_overflow", reduce_over_devices, x, "sum")
    assert str(x.dtype) in err.message and f"over {devices} devices" in err.message


@pytest.mark.parametrize("devices", [SMALL, LARGE], ids=["small", "large"])
@pytest.mark.parametrize(
    ("values", "dtype", "fits"),
    [
        ([I64_MAX, 1], "int64", False),  # the attack: answered -2**63 before
        ([I64_MIN, -1], "int64", False),
        ([I64_MAX, 1, -1], "int64", True),  # a partial sum wraps, the sum fits
        ([I64_MIN, I64_MAX, 1], "int64", True),
        ([U64_MAX, 1], "uint64", False),  # wrapped to 0 before
        ([U64_MAX, 0], "uint64", True),
        ([2**62, 2**62], "int64", False),
        ([2**62, 2**62 - 1], "int64", True),
    ],
    ids=lambda v: str(v) if not isinstance(v, list) else "x".join(map(str, v))[:40],
)
def test_64_bit_sums_near_the_edge(values, dtype, fits, devices):
    values = values + [0] * (devices - len(values))  # zeros pad to the device count
    x = np.array(values, dtype=dtype)
    if fits:
        out = reduce_sum({"n": x})["n"]
        assert int(out) == sum(values) and out.dtype == np.dtype(dtype)
    else:
        assert_metrics_error("integer_overflow", reduce_sum, {"n": x})


def test_overflow_names_the_metric_and_counts_positions():
    x = np.zeros((SMALL, 3), dtype=np.int64)
    x[:2, 1] = I64_MAX  # only column 1 overflows
    err = assert_metrics_error("integer_overflow", reduce_custom, {"hits": x}, {"hits": "sum"})
    assert err.message.startswith("metric 'hits':") and "at 1 of 3 position(s)" in err.message
    err = assert_metrics_error(
        "integer_overflow", reduce_custom, {"hits": {"inner": x}}, {"hits": "sum"}
    )
    assert "metric 'hits'" in err.message  # the tree path names it too
    # max/min over the same values are exact, never refused.
    assert reduce_custom({"hits": x}, {"hits": "max"})["hits"].tolist() == [0, I64_MAX, 0]


def test_int_sum_bounds_settle_small_dtypes_without_a_pass():
    assert not int_sum_may_overflow(_extreme("int32", 1000))  # 1000 * 2**31 < 2**63
    assert int_sum_may_overflow(np.array([I64_MAX, 0]))
    assert not int_sum_may_overflow(np.array([2**61, 2**61], dtype=np.int64))
    # A range narrower than the accumulator (what a JAX int32 sum must fit):
    assert int_sum_may_overflow(_extreme("int32", 2), -(2**31), 2**31 - 1)


def test_split_sums_match_python_integers():
    rng = np.random.default_rng(26)
    for devices in (1, 2, 3, 65, 300):
        for dtype, low, high in (("int64", I64_MIN, I64_MAX + 1), ("uint64", 0, U64_MAX + 1)):
            picks = [low, high - 1, 0, 1, -1 if low else 2]
            values = [
                [int(v) for v in rng.integers(low, high, size=4, dtype=dtype)]
                if i % 2
                else [picks[(i + j) % len(picks)] for j in range(4)]
                for i in range(devices)
            ]
            x = np.array(values, dtype=dtype)
            total, outside = int_sum_exact(x)
            exact = [sum(row[j] for row in values) for j in range(4)]
            bad = [not low <= v < high for v in exact]
            assert outside == sum(bad)
            for j in range(4):
                if not bad[j]:
                    assert int(total[j]) == exact[j]
                mean = Fraction(exact[j], devices)
                got = Fraction(float(int_mean_exact(x)[j]))
                assert abs(got - mean) <= abs(mean) * Fraction(1, 2**52)


# ----------------------------------------------------------------- integer means


@pytest.mark.parametrize("devices", [2, LARGE], ids=["small", "large"])
@pytest.mark.parametrize(
    ("values", "dtype"),
    [
        ([2**60 + 1, -(2**60)], "int64"),  # a float64 sum gives 0, the mean is 0.5
        ([I64_MAX, I64_MAX], "int64"),  # the sum passes 64 bits, the mean does not
        ([I64_MIN, I64_MIN, -1], "int64"),
        ([U64_MAX, U64_MAX, U64_MAX], "uint64"),
        ([2**53 + 1, 2**53 + 1, 1], "int64"),
    ],
    ids=lambda v: str(v) if not isinstance(v, list) else "x".join(map(str, v))[:40],
)
def test_integer_means_come_from_the_exact_sum(values, dtype, devices):
    values = values * (devices // len(values)) + values[: devices % len(values)]
    x = np.array(values, dtype=dtype)
    out = reduce_mean({"m": x})["m"]
    exact = Fraction(sum(values), len(values))
    assert type(out) is np.float64
    assert abs(Fraction(float(out)) - exact) <= abs(exact) * Fraction(1, 2**52), (out, exact)
    # 2-D: the same per position.
    wide = np.stack([x, x[::-1]], axis=1)
    both = reduce_mean({"m": wide})["m"]
    assert abs(Fraction(float(both[1])) - exact) <= abs(exact) * Fraction(1, 2**52)


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_small_integer_means_equal_numpy(dtype):
    x = _extreme(dtype, LARGE, width=3)
    x[0] = np.iinfo(dtype).min
    assert np.asarray(reduce_over_devices(x, "mean")).tobytes() == np.mean(x, axis=0).tobytes()


def test_weighted_and_omitted_integer_means_do_not_wrap():
    x = np.array([I64_MAX, I64_MAX], dtype=np.int64)
    assert reduce_mean({"m": x}, weights=[1, 1])["m"] == pytest.approx(float(I64_MAX))
    assert reduce_mean({"m": x}, nan_policy="omit")["m"] == pytest.approx(float(I64_MAX))
    assert_metrics_error("integer_overflow", reduce_sum, {"m": x}, nan_policy="omit")


# ----------------------------------------------------------------------- floats


@pytest.mark.parametrize(
    ("values", "dtype", "op", "expected"),
    [
        ([1e308, 1e308], "float64", "mean", 1e308),  # answered null (inf) before
        ([1e308] * 3 + [-1e308], "float64", "mean", 0.5e308),
        ([1e308, 1e308, -1e308], "float64", "sum", 1e308),
        ([1e308, 1e308], "float64", "sum", math.inf),  # the true sum overflows: inf
        ([3e38, 3e38], "float32", "mean", 3e38),
        ([3e38, 3e38, -3e38], "float32", "sum", 3e38),
        ([60000, 60000, -60000], "float16", "sum", 60000),
        ([math.inf, 1.0], "float64", "mean", math.inf),  # non-finite inputs propagate
        ([math.inf, -math.inf], "float64", "sum", math.nan),
        ([math.nan, 1e308, 1e308], "float64", "mean", math.nan),
    ],
    ids=lambda v: str(v) if not isinstance(v, list) else "x".join(map(str, v))[:30],
)
def test_float_reductions_overflow_only_where_the_result_does(values, dtype, op, expected):
    x = np.array(values, dtype=dtype)
    for out in (reduce_over_devices(x, op), reduce_custom({"x": x}, {"x": op})["x"]):
        assert out.dtype == np.dtype(dtype)
        got = float(out)
        assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(
            expected, rel=1e-3 if dtype == "float16" else 1e-6
        ), (values, op, got)
    # 2-D: only the overflowing position is recomputed; the other is untouched.
    wide = np.stack([x, np.arange(len(values), dtype=dtype)], axis=1)
    out = reduce_over_devices(wide, op)
    plain = getattr(np, op)(np.arange(len(values), dtype=dtype))
    assert out[1] == plain and out.dtype == np.dtype(dtype)


def test_omitted_non_finite_entries_and_overflow_together():
    x = np.array([[1e308, 1.0], [1e308, np.nan], [np.nan, 3.0]])
    out = reduce_mean({"x": x}, nan_policy="omit")["x"]
    assert out.tolist() == [1e308, 2.0]
    out = reduce_sum({"x": np.array([[1e308], [1e308], [-1e308], [np.inf]])}, nan_policy="omit")
    assert out["x"].tolist() == [1e308]


def test_scaled_kernels_equal_plain_ones_where_those_are_finite():
    rng = np.random.default_rng(7)
    for dtype in ("float32", "float64"):
        x = rng.normal(size=(37, 5)).astype(dtype)
        assert np.array_equal(scaled_sum(x), np.add.reduce(x, axis=0))
        assert np.allclose(scaled_mean(x, x.shape[0]), np.mean(x, axis=0), rtol=1e-6)


# -------------------------------------------------------------------- weights


@pytest.mark.parametrize("scale", [1e-320, 1e-300, 1.0, 1e300, 8e307], ids=str)
def test_weighted_means_do_not_depend_on_the_weights_scale(scale):
    x = np.array([1.0, 3.0, 5.0, 7.0])
    w = np.array([1.0, 1.0, 2.0, 0.0]) * scale  # 1e-320: subnormal weights
    exact = [Fraction(float(v)) for v in w]  # the weights as sent, in exact arithmetic
    reference = float(sum(e * Fraction(v) for e, v in zip(exact, x, strict=True)) / sum(exact))
    got = reduce_mean({"x": x}, weights=w)["x"]
    assert got == pytest.approx(reference, rel=1e-12), scale


def test_the_reported_weights_attack():
    # weights [1e308, 1e308] answered 0.0 (their sum overflowed to inf).
    out = reduce_mean({"x": np.array([1.0, 3.0])}, weights=[1e308, 1e308])
    assert out["x"] == 2.0
    out = reduce_mean({"x": np.array([1.0, np.nan])}, weights=[1e308, 1e308], nan_policy="omit")
    assert out["x"] == 1.0
    jax_out = reduce_mean({"x": jnp.array([1.0, 3.0])}, weights=jnp.array([1e30, 1e30]))
    assert float(jax_out["x"]) == 2.0


# ------------------------------------------------------------------------- JAX


def test_jax_integer_sums_are_refused_when_they_would_wrap():
    acc = jax.dtypes.canonicalize_dtype(np.int64)
    top = int(np.iinfo(acc).max)
    x = jnp.array([top, 1], dtype=acc)
    err = assert_metrics_error("integer_overflow", reduce_sum, {"n": x})
    assert str(np.dtype(acc)) in err.message
    assert int(reduce_sum({"n": jnp.array([top, 1, -1], dtype=acc)})["n"]) == top
    # int8 sums in JAX's default int: 8 * 127 fits, no check needed.
    assert int(reduce_sum({"n": jnp.full(8, 127, jnp.int8)})["n"]) == 8 * 127


def test_traced_jax_integer_sums_keep_jax_modular_arithmetic():
    # Documented: a traced value cannot be inspected, so inside jit the sum is JAX's own
    # (the eager call above refuses it). This pins the documented behaviour.
    acc = jax.dtypes.canonicalize_dtype(np.int64)
    top = int(np.iinfo(acc).max)
    out = jax.jit(lambda m: reduce_sum(m))({"n": jnp.array([top, 1], dtype=acc)})
    assert int(out["n"]) == int(np.iinfo(acc).min)


def test_jax_float_means_and_sums_do_not_overflow_eagerly():
    assert float(reduce_mean({"x": jnp.array([3e38, 3e38], jnp.float32)})["x"]) == pytest.approx(
        3e38
    )
    assert float(reduce_sum({"x": jnp.array([3e38, 3e38, -3e38])})["x"]) == pytest.approx(3e38)
    assert math.isinf(float(reduce_mean({"x": jnp.array([jnp.inf, 1.0])})["x"]))
    assert math.isnan(float(reduce_mean({"x": jnp.array([jnp.nan, 3e38])})["x"]))
