"""datarax.metrics._exact_reductions, its own functions and their contracts: the
overflow bound is sound (False only where every exact sum fits) and sharp at the boundary,
the split sum is the exact sum wherever that fits and counts the positions that do not,
the integer mean is within one ulp of the exact mean, and the scaled float sums are finite
wherever the true result is. Checked against Python's integers and ``fractions.Fraction``
for every integer and float dtype at its extremes. (The public reductions built on these
are tested end to end in tests/datarax/test_exact_numbers.py.)"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from datarax.metrics._exact_reductions import (
    FLOAT_EXACT,
    all_finite,
    int_mean_exact,
    int_sum_exact,
    int_sum_may_overflow,
    scaled_mean,
    scaled_sum,
)

SIGNED = ["int8", "int16", "int32", "int64"]
UNSIGNED = ["uint8", "uint16", "uint32", "uint64"]
INT_DTYPES = SIGNED + UNSIGNED
FLOAT_DTYPES = ["float16", "float32", "float64"]
I64 = np.iinfo(np.int64)
U64 = np.iinfo(np.uint64)


def _acc(dtype):
    return np.dtype(np.int64) if np.dtype(dtype).kind == "i" else np.dtype(np.uint64)


def _exact_sums(x):
    """Column sums of ``x`` over axis 0 as Python integers, flattened."""
    x = np.asarray(x)
    cols = x.reshape(x.shape[0], -1)
    return [sum(int(v) for v in cols[:, j]) for j in range(cols.shape[1])]


def _extremes(dtype, n):
    """``[n, 6]`` columns at the dtype's edges: all max, all min, max then min
    alternating, max with one 1 (or -1 for signed), zeros, one max among zeros."""
    info = np.iinfo(dtype)
    lo, hi = int(info.min), int(info.max)
    alt = [hi if i % 2 == 0 else lo for i in range(n)]
    nudge = [hi] * (n - 1) + [-1 if info.min < 0 else 1]
    one_max = [hi] + [0] * (n - 1)
    cols = [[hi] * n, [lo] * n, alt, nudge, [0] * n, one_max]
    return np.array(cols, dtype=object).T.astype(dtype)


def _fits(value, dtype):
    info = np.iinfo(_acc(dtype))
    return int(info.min) <= value <= int(info.max)


# ---------------------------------------------------------------- int_sum_may_overflow


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "uint8", "uint16", "uint32"])
@pytest.mark.parametrize("n", [1, 2, 1000, 2**31 // 8])
def test_small_dtypes_never_overflow_the_64_bit_accumulator(dtype, n):
    # n * max|x| <= 2**63 - 1 for every n here: settled by the dtype, whatever the values.
    x = np.broadcast_to(np.array(np.iinfo(dtype).max, dtype=dtype), (n, 2))
    assert not int_sum_may_overflow(x)
    x = np.broadcast_to(np.array(np.iinfo(dtype).min, dtype=dtype), (n, 2))
    assert not int_sum_may_overflow(x)


# n equal values v: n * v against the accumulator's range, one step each side.
BOUNDARY = [
    pytest.param("int64", 2, 2**62 - 1, False, id="int64-high-fits"),
    pytest.param("int64", 2, 2**62, True, id="int64-high-over"),
    pytest.param("int64", 2, -(2**62), False, id="int64-low-fits"),
    pytest.param("int64", 2, -(2**62) - 1, True, id="int64-low-over"),
    pytest.param("int64", 1, int(I64.max), False, id="int64-single-max"),
    pytest.param("int64", 1, int(I64.min), False, id="int64-single-min"),
    pytest.param("int64", 3, (2**63 - 1) // 3, False, id="int64-n3-fits"),
    pytest.param("int64", 3, (2**63 - 1) // 3 + 1, True, id="int64-n3-over"),
    pytest.param("uint64", 2, 2**63 - 1, False, id="uint64-high-fits"),
    pytest.param("uint64", 2, 2**63, True, id="uint64-high-over"),
    pytest.param("uint64", 1, int(U64.max), False, id="uint64-single-max"),
    pytest.param("uint64", 5, (2**64 - 1) // 5, False, id="uint64-n5-fits"),
    pytest.param("uint64", 5, (2**64 - 1) // 5 + 1, True, id="uint64-n5-over"),
]


@pytest.mark.parametrize(("dtype", "n", "value", "over"), BOUNDARY)
def test_overflow_bound_at_the_accumulator_boundary(dtype, n, value, over):
    x = np.full((n, 3), value, dtype=dtype)
    assert int_sum_may_overflow(x) is over
    # And it is the truth here (equal values: the bound is exact).
    assert (not all(_fits(s, dtype) for s in _exact_sums(x))) is over


# Custom [low, high]: FLOAT_EXACT bounds ask whether a float64 sum could be inexact.
CUSTOM = [
    pytest.param("int64", [2**51] * 4, False, id="int64-sum-2**53-fits"),
    pytest.param("int64", [2**51 + 1] + [2**51] * 3, True, id="int64-above-2**53"),
    pytest.param("int64", [-(2**51)] * 4, False, id="int64-sum-minus-2**53-fits"),
    pytest.param("int64", [-(2**51) - 1] + [-(2**51)] * 3, True, id="int64-below-minus-2**53"),
    pytest.param("uint64", [2**52] * 2, False, id="uint64-sum-2**53-fits"),
    pytest.param("uint64", [2**52 + 1, 0], True, id="uint64-bound-uses-max-not-sum"),
    pytest.param("int32", [int(np.iinfo(np.int32).max)] * 1000, False, id="int32-by-dtype"),
    pytest.param("uint32", [int(np.iinfo(np.uint32).max)] * 4, False, id="uint32-by-dtype"),
]


@pytest.mark.parametrize(("dtype", "values", "over"), CUSTOM)
def test_overflow_bound_against_float_exact(dtype, values, over):
    x = np.array(values, dtype=dtype)
    assert int_sum_may_overflow(x, -FLOAT_EXACT, FLOAT_EXACT) is over


@pytest.mark.parametrize(
    ("dtype", "values", "low", "high", "over"),
    [
        pytest.param("int8", [[100]], -128, 100, False, id="int8-at-high"),
        pytest.param("int8", [[101]], -128, 100, True, id="int8-past-high"),
        pytest.param("int8", [[-100]], -100, 127, False, id="int8-at-low"),
        pytest.param("int8", [[-101]], -100, 127, True, id="int8-past-low"),
        pytest.param("uint8", [[3], [3]], 0, 6, False, id="uint8-2x3-at-6"),
        pytest.param("uint8", [[3], [4]], 0, 6, True, id="uint8-bound-is-n-times-max"),
        pytest.param("int32", [[2**31 - 1]] * 2, -(2**31), 2**31 - 1, True, id="int32-own-range"),
    ],
)
def test_overflow_bound_with_tight_custom_ranges(dtype, values, low, high, over):
    assert int_sum_may_overflow(np.array(values, dtype=dtype), low, high) is over


@pytest.mark.parametrize(
    "shape", [(0,), (0, 3), (4, 0), (2, 0, 5)], ids=lambda s: "x".join(map(str, s))
)
@pytest.mark.parametrize("dtype", ["int64", "uint64"])
def test_empty_arrays_never_overflow(shape, dtype):
    assert not int_sum_may_overflow(np.zeros(shape, dtype=dtype))


@pytest.mark.parametrize(
    "values",
    [
        pytest.param([2**62, -(2**62)], id="cancelling-signs"),
        pytest.param([int(I64.max), int(I64.min)], id="max-plus-min"),
        pytest.param([int(I64.max), -1, 0], id="max-minus-one"),
    ],
)
def test_overflow_bound_is_conservative_where_the_sum_still_fits(values):
    # Only a bound: True here, though the exact sum fits (int_sum_exact then decides).
    x = np.array(values, dtype=np.int64)
    assert int_sum_may_overflow(x)
    total, outside = int_sum_exact(x)
    assert outside == 0 and int(total) == sum(values)


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_overflow_bound_is_sound_on_random_wide_values(dtype):
    """Whenever the bound says False, every exact column sum fits the accumulator."""
    rng = np.random.default_rng(7)
    info = np.iinfo(dtype)
    for n in (1, 2, 3, 8, 33):
        for _ in range(20):
            scale = rng.choice([1, 2**8, 2**16, 2**32])
            lo, hi = int(info.min) // int(scale), int(info.max) // int(scale)
            x = rng.integers(lo, hi, size=(n, 4), dtype=dtype, endpoint=True)
            sums = _exact_sums(x)
            if not int_sum_may_overflow(x):
                assert all(_fits(s, dtype) for s in sums), (x, sums)
            if not all(_fits(s, dtype) for s in sums):
                assert int_sum_may_overflow(x)


# ---------------------------------------------------------------- int_sum_exact


@pytest.mark.parametrize("dtype", INT_DTYPES)
@pytest.mark.parametrize("n", [1, 2, 3, 8, 17])
def test_split_sum_at_the_extremes_of_every_dtype(dtype, n):
    x = _extremes(dtype, n)
    total, outside = int_sum_exact(x)
    acc = _acc(dtype)
    assert total.dtype == acc and total.shape == (x.shape[1],)
    sums = _exact_sums(x)
    assert outside == sum(not _fits(s, dtype) for s in sums)
    for got, want in zip(total.tolist(), sums, strict=True):
        if _fits(want, dtype):
            assert got == want
        else:  # modular: the wrapped value, never a saturated or float one
            wrapped = want % 2**64
            if acc.kind == "i" and wrapped >= 2**63:
                wrapped -= 2**64
            assert got == wrapped


@pytest.mark.parametrize(
    ("dtype", "values", "outside"),
    [
        pytest.param("int64", [int(I64.max), 1], 1, id="int64-max-plus-1"),
        pytest.param("int64", [int(I64.max), 0], 0, id="int64-max-plus-0"),
        pytest.param("int64", [int(I64.min), -1], 1, id="int64-min-minus-1"),
        pytest.param("int64", [int(I64.min), 0], 0, id="int64-min-plus-0"),
        pytest.param("int64", [int(I64.max)] * 2 + [2], 1, id="int64-wraps-to-0"),
        pytest.param(
            "int64", [int(I64.max)] * 2 + [int(I64.min)] * 2 + [-1], 0, id="int64-net-minus-2"
        ),
        pytest.param("uint64", [int(U64.max), 1], 1, id="uint64-max-plus-1"),
        pytest.param("uint64", [int(U64.max), 0], 0, id="uint64-max-plus-0"),
        pytest.param("uint64", [int(U64.max)] * 3, 1, id="uint64-3x-max"),
        pytest.param("uint64", [2**63, 2**63 - 1], 0, id="uint64-exactly-max"),
        pytest.param("uint64", [2**63, 2**63], 1, id="uint64-exactly-2**64"),
    ],
)
def test_split_sum_on_either_side_of_64_bits(dtype, values, outside):
    x = np.array(values, dtype=dtype)
    total, got_outside = int_sum_exact(x)
    assert got_outside == outside
    assert total.shape == () and total.dtype == _acc(dtype)
    if not outside:
        assert int(total) == sum(values)


@pytest.mark.parametrize(
    ("dtype", "values", "low", "high", "outside"),
    [
        pytest.param(
            "int64",
            [[2**52, 2**52 + 1, -(2**52), -(2**52) - 1]] * 2,
            -FLOAT_EXACT,
            FLOAT_EXACT,
            2,
            id="float-exact",
        ),
        pytest.param(
            "int64",
            [[int(I64.max)], [int(I64.max)], [2]],
            -FLOAT_EXACT,
            FLOAT_EXACT,
            1,
            id="wrap-lands-in-range",
        ),
        pytest.param("int64", [[5, 6, -5, -6]], -5, 5, 2, id="tight-both-sides"),
        pytest.param(
            "uint64", [[2**52, 2**52 + 1]] * 2, 0, FLOAT_EXACT, 1, id="uint64-float-exact"
        ),
        pytest.param("uint64", [[1, 2, 3]], 2, int(U64.max), 1, id="uint64-raised-low"),
        pytest.param("uint64", [[int(U64.max)], [1]], 0, 10, 1, id="uint64-wrap-to-0-in-range"),
        pytest.param("int8", [[127, -128, 5]] * 3, -100, 100, 2, id="int8-bounds"),
    ],
)
def test_split_sum_counts_positions_outside_a_custom_range(dtype, values, low, high, outside):
    x = np.array(values, dtype=dtype)
    sums = _exact_sums(x)
    assert outside == sum(not low <= s <= high for s in sums)  # the table is right
    total, got_outside = int_sum_exact(x, low, high)
    assert got_outside == outside
    for got, want in zip(np.atleast_1d(total).tolist(), sums, strict=True):
        if _fits(want, dtype):
            assert got == want


@pytest.mark.parametrize(
    "shape", [(5,), (5, 3), (4, 2, 3), (1, 1, 1)], ids=lambda s: "x".join(map(str, s))
)
@pytest.mark.parametrize("dtype", ["int64", "uint64", "int16"])
def test_split_sum_keeps_the_trailing_shape(shape, dtype):
    rng = np.random.default_rng(3)
    info = np.iinfo(dtype)
    x = rng.integers(int(info.min), int(info.max), size=shape, dtype=dtype, endpoint=True)
    total, outside = int_sum_exact(x)
    assert total.shape == shape[1:]
    sums = _exact_sums(x)
    assert outside == sum(not _fits(s, dtype) for s in sums)
    assert [v for v, s in zip(np.ravel(total).tolist(), sums, strict=True) if _fits(s, dtype)] == [
        s for s in sums if _fits(s, dtype)
    ]


@pytest.mark.parametrize("dtype", ["int64", "uint64"])
def test_split_sum_matches_python_integers_on_random_full_range_values(dtype):
    rng = np.random.default_rng(11)
    info = np.iinfo(dtype)
    for n in (2, 3, 7, 64, 257):
        x = rng.integers(int(info.min), int(info.max), size=(n, 16), dtype=dtype, endpoint=True)
        total, outside = int_sum_exact(x)
        sums = _exact_sums(x)
        assert outside == sum(not _fits(s, dtype) for s in sums)
        for got, want in zip(total.tolist(), sums, strict=True):
            if _fits(want, dtype):
                assert got == want


# ---------------------------------------------------------------- int_mean_exact


def _assert_within_one_ulp(got, exact):
    want = float(exact)  # correctly rounded
    assert abs(Fraction(float(got)) - exact) <= Fraction(math.ulp(want)), (got, exact)


MEANS = [
    pytest.param("int64", [2**60 + 1, -(2**60)], id="half-lost-by-float64-sum"),
    pytest.param("int64", [int(I64.max)] * 3, id="int64-3x-max-passes-64-bits"),
    pytest.param("int64", [int(I64.min)] * 3, id="int64-3x-min-passes-64-bits"),
    pytest.param("int64", [int(I64.max), int(I64.max), int(I64.min)], id="int64-mixed"),
    pytest.param("int64", [-1, 0, 0, 0, 0], id="minus-one-fifth"),
    pytest.param("int64", [int(I64.min), -1, -1], id="int64-min-and-minus-ones"),
    pytest.param("int64", [2**53 + 1, 2**53 + 1, 2**53 + 2], id="odd-above-2**53"),
    pytest.param("uint64", [int(U64.max)] * 5, id="uint64-5x-max"),
    pytest.param("uint64", [int(U64.max), 1], id="uint64-max-plus-1"),
    pytest.param("uint64", [2**63 + 1, 2**63], id="uint64-half"),
    pytest.param("int8", [127, 127, -128], id="int8-edges"),
    pytest.param("uint32", [2**32 - 1] * 3, id="uint32-max"),
]


@pytest.mark.parametrize(("dtype", "values"), MEANS)
def test_integer_mean_is_within_one_ulp_of_the_exact_mean(dtype, values):
    x = np.array(values, dtype=dtype)
    out = int_mean_exact(x)
    assert isinstance(out, np.ndarray) and out.shape == () and out.dtype == np.float64
    _assert_within_one_ulp(out, Fraction(sum(values), len(values)))


def test_the_half_is_what_a_float64_mean_loses():
    x = np.array([2**60 + 1, -(2**60)], dtype=np.int64)
    assert np.mean(x) == 0.0  # the case bites: float64 drops the low bit
    assert int_mean_exact(x) == 0.5


@pytest.mark.parametrize("dtype", INT_DTYPES)
@pytest.mark.parametrize("n", [1, 2, 3, 7, 16])
def test_integer_mean_at_the_extremes_of_every_dtype(dtype, n):
    x = _extremes(dtype, n)
    out = int_mean_exact(x)
    assert out.shape == (x.shape[1],) and out.dtype == np.float64
    for got, total in zip(out.tolist(), _exact_sums(x), strict=True):
        _assert_within_one_ulp(got, Fraction(total, n))


@pytest.mark.parametrize("dtype", ["int64", "uint64"])
def test_integer_mean_on_random_full_range_values(dtype):
    rng = np.random.default_rng(5)
    info = np.iinfo(dtype)
    for n in (2, 3, 5, 31, 100):
        x = rng.integers(int(info.min), int(info.max), size=(n, 3, 4), dtype=dtype, endpoint=True)
        out = int_mean_exact(x)
        assert out.shape == (3, 4)
        for got, total in zip(out.ravel().tolist(), _exact_sums(x), strict=True):
            _assert_within_one_ulp(got, Fraction(total, n))


# ---------------------------------------------------------------- scaled_sum / scaled_mean


def _max(dtype):
    return float(np.finfo(dtype).max)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize(
    ("coefficients", "true_multiple"),
    [
        pytest.param([1, 1, -1], 1, id="max+max-max"),
        pytest.param([1, 1, -1, -1, 1], 1, id="five-alternating"),
        pytest.param([1, 1, -1, -1], 0, id="cancels-to-0"),
        pytest.param([-1, -1, 1], -1, id="negative-side"),
        pytest.param([1, -1, 1, 1, -1, -1, 1, -1], 0, id="eight-cancel"),
    ],
)
def test_scaled_sum_is_finite_and_exact_where_the_true_sum_is(dtype, coefficients, true_multiple):
    big = _max(dtype)
    x = np.array([c * big for c in coefficients], dtype=dtype)
    if dtype != "float16":  # NumPy sums float16 in float32 inside its loop
        with np.errstate(over="ignore", invalid="ignore"):
            plain = np.add.reduce(x, axis=0)
        assert not np.isfinite(plain)  # the plain sum overflows on the way
    out = scaled_sum(x)
    assert out.dtype == np.dtype(dtype)
    assert out == np.array(true_multiple * big, dtype=dtype)  # powers of two: exact here


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize(
    ("coefficients", "sign"),
    [
        pytest.param([1, 1], 1, id="2x-max"),
        pytest.param([-1, -1], -1, id="2x-minus-max"),
        pytest.param([1, 1, 1, -1], 1, id="net-2x-max"),
    ],
)
def test_scaled_sum_overflows_where_the_true_sum_does(dtype, coefficients, sign):
    big = _max(dtype)
    x = np.array([c * big for c in coefficients], dtype=dtype)
    with np.errstate(over="ignore"):
        out = scaled_sum(x)
    assert np.isinf(out) and np.sign(out) == sign


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 9, 100, 128])
def test_scaled_mean_of_n_copies_of_max_is_finite_and_max(dtype, n):
    big = _max(dtype)
    x = np.full((n, 2), big, dtype=dtype)
    x[:, 1] = -big
    out = scaled_mean(x, n)
    assert out.dtype == np.dtype(dtype)
    assert np.isfinite(out).all()
    if n & (n - 1) == 0:  # n a power of two: every step is exact
        assert out.tolist() == [big, -big]
    else:  # the sum of n scaled copies rounds once, the division once more
        ulp = float(np.spacing(np.array(big / 2, dtype=dtype)))
        assert out.tolist() == pytest.approx([big, -big], abs=2 * ulp)
    if n > 1 and dtype != "float16":
        with np.errstate(over="ignore"):
            assert not np.isfinite(np.mean(x, axis=0, dtype=dtype)).any()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_scaled_mean_divides_by_the_given_count(dtype):
    big = _max(dtype)
    x = np.array([big, big, big, big], dtype=dtype)
    assert scaled_mean(x, 8) == np.array(big / 2, dtype=dtype)  # half of max: exact
    with np.errstate(over="ignore"):
        assert scaled_mean(x, 2) == np.inf  # 2 * max: the true value overflows too


@pytest.mark.parametrize(
    ("src", "acc"),
    [("float16", "float32"), ("float32", "float64"), ("float16", "float64")],
)
def test_scaled_kernels_accumulate_in_the_given_dtype(src, acc):
    big = _max(src)
    x = np.array([big, big, big], dtype=src)
    total = scaled_sum(x, dtype=acc)
    mean = scaled_mean(x, 3, dtype=acc)
    assert total.dtype == np.dtype(acc) and mean.dtype == np.dtype(acc)
    assert total == 3 * big and mean == big  # finite in the wider accumulator


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_scaled_sum_is_finite_on_random_huge_values_whose_true_sum_is(dtype):
    """n/2 values in [max/2, max], then n/2 that cancel each to within max/n: the true
    sums stay below max/2 while the plain partial sums run past max."""
    rng = np.random.default_rng(13)
    big = _max(dtype)
    eps = float(np.finfo(dtype).eps)
    for n in (2, 4, 6, 16, 64):
        pos = rng.uniform(0.5, 1.0, size=(n // 2, 32)) * big
        neg = -pos[rng.permutation(n // 2)] * rng.uniform(1 - 1 / n, 1.0, size=pos.shape)
        x = np.concatenate([pos, neg]).astype(dtype)
        exact = [sum(Fraction(float(v)) for v in x[:, j]) for j in range(x.shape[1])]
        assert all(abs(e) <= Fraction(big) for e in exact)
        if n >= 4 and dtype != "float16":
            with np.errstate(over="ignore"):
                assert not np.isfinite(np.add.reduce(x, axis=0)).all()
        out = scaled_sum(x)
        assert np.isfinite(out).all()
        for got, want in zip(out.tolist(), exact, strict=True):
            assert abs(Fraction(got) - want) <= Fraction(n * eps * big)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_scaled_sum_equals_the_plain_sum_where_that_is_finite(dtype):
    """Scaling by powers of two is exact away from the subnormals: same bits."""
    rng = np.random.default_rng(17)
    tiny, big = float(np.finfo(dtype).tiny), _max(dtype)
    for n in (1, 2, 3, 8, 50):
        x = rng.uniform(-1, 1, size=(n, 8)) * rng.choice([1.0, big / 256], size=(1, 8))
        x = np.where(np.abs(x) < tiny * 2**8, tiny * 2**8, x).astype(dtype)
        plain = np.add.reduce(x, axis=0)
        assert np.isfinite(plain).all()
        assert scaled_sum(x).tobytes() == plain.tobytes()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize(
    ("values", "want"),
    [
        pytest.param([np.nan, 1.0], "nan", id="nan"),
        pytest.param([np.inf, 1.0], "inf", id="inf"),
        pytest.param([-np.inf, "max"], "-inf", id="minus-inf-and-max"),
        pytest.param([np.inf, -np.inf], "nan", id="inf-minus-inf"),
        pytest.param([np.nan, "max", "max"], "nan", id="nan-and-overflow"),
    ],
)
def test_non_finite_inputs_give_the_plain_non_finite_result(dtype, values, want):
    big = _max(dtype)
    x = np.array([big if v == "max" else v for v in values], dtype=dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        total, mean = scaled_sum(x), scaled_mean(x, x.shape[0])
    for out in (total, mean):
        if want == "nan":
            assert np.isnan(out)
        else:
            assert out == float(want)


# ---------------------------------------------------------------- all_finite, FLOAT_EXACT


@pytest.mark.parametrize(
    ("value", "finite"),
    [
        pytest.param(1.0, True, id="float"),
        pytest.param(0, True, id="int"),
        pytest.param(float("nan"), False, id="nan"),
        pytest.param(float("inf"), False, id="inf"),
        pytest.param(float("-inf"), False, id="minus-inf"),
        pytest.param(np.float16(65504), True, id="float16-max"),
        pytest.param(np.float16(np.inf), False, id="float16-inf"),
        pytest.param(np.float32(np.nan), False, id="float32-nan"),
        pytest.param(np.int64(I64.max), True, id="int64-max"),
        pytest.param(np.array(2.0), True, id="0d-array"),
        pytest.param(np.array(np.nan), False, id="0d-nan"),
        pytest.param(np.array([1.0, 2.0, 3.0]), True, id="array"),
        pytest.param(np.array([1.0, np.inf, 3.0]), False, id="array-one-inf"),
        pytest.param(np.array([[1.0], [np.nan]]), False, id="2d-one-nan"),
        pytest.param(np.array([], dtype=np.float64), True, id="empty"),
        pytest.param(np.array([1, 2], dtype=np.int8), True, id="int-array"),
    ],
)
def test_all_finite(value, finite):
    assert all_finite(value) is finite


def test_float_exact_is_the_last_integer_float64_holds_with_its_neighbours():
    assert FLOAT_EXACT == 2**53
    for v in (FLOAT_EXACT - 1, FLOAT_EXACT, -FLOAT_EXACT):
        assert int(float(v)) == v
    assert int(float(FLOAT_EXACT + 1)) != FLOAT_EXACT + 1
