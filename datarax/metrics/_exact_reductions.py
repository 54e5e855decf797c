"""Sums and means over the leading (device) axis that never wrap and never overflow where
the true result is representable. NumPy only; private to the kernels
(:mod:`datarax.metrics._numpy_kernels`, and :mod:`datarax.metrics._reduce_kernels`
for JAX integer sums), which decide when they are needed and turn an overflow into
``MetricsError("integer_overflow")``.

Integers: NumPy sums ``int8``..``int64`` in ``int64`` and ``uint8``..``uint64`` in
``uint64``, modulo 2**64: ``[2**63 - 1, 1]`` sums to ``-2**63``. A modular sum is still
the exact sum whenever the exact sum fits (the wrap-arounds cancel), so the only question
is whether it fits. :func:`int_sum_may_overflow` answers it cheaply from bounds (the dtype
alone for small integers; one max and one min pass for 64-bit ones); only when the bounds
cannot rule an overflow out does :func:`int_sum_exact` split every value into its high
and low 32 bits, sum both halves exactly and read off, per position, whether the exact
sum fits. The mean of integers divides that exact sum (:func:`int_mean_exact`), so it is
within one unit in the last place of the exact mean, where a float64 sum of large
integers loses their low bits (``[2**60 + 1, -2**60]`` has mean 0.5, not 0).

Floats: a sum or mean overflows to inf when a partial sum passes the dtype's range even
though the result does not (the mean of ``[1e308, 1e308]``). :func:`scaled_sum` and
:func:`scaled_mean` sum ``x * 2**-k`` with ``2**k >= n``, so no partial sum passes
``max |x|``, and scale back: exact scalings by powers of two, so the values are those of
the plain sum wherever that one is finite. They run only at positions whose plain result
is not finite (the caller checks the small result, not the stacked input), and a
non-finite input (NaN, inf) gives the same non-finite result as before.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

_HALF = 32
_LOW_MASK = (1 << _HALF) - 1
FLOAT_EXACT = 2**53
"""float64 holds every integer of at most this magnitude (a float64 sum of integers whose
partial sums stay below it is exact)."""


def _accumulator(dtype: np.dtype) -> np.dtype:
    """The dtype NumPy sums an integer dtype in (``np.add.reduce``'s default)."""
    return np.dtype(np.int64) if dtype.kind == "i" else np.dtype(np.uint64)


@functools.cache
def _ranges(dtype: np.dtype) -> tuple[int, int, int, int]:
    """(min, max) of an integer dtype and of its accumulator (``np.iinfo`` costs about a
    microsecond a call, as much as reducing a small metric)."""
    info, acc = np.iinfo(dtype), np.iinfo(_accumulator(dtype))
    return int(info.min), int(info.max), int(acc.min), int(acc.max)


def int_sum_may_overflow(x: np.ndarray, low: int | None = None, high: int | None = None) -> bool:
    """Whether the sum over axis 0 of integer ``x`` might leave ``[low, high]``.

    Args:
      x: ``[n, ...]`` integer array (not bool).
      low, high: the range to stay in; default the accumulator's (``int64``/``uint64``).
        ``FLOAT_EXACT`` bounds ask whether a float64 sum might be inexact.

    Returns:
      False when ``n * max |x|`` provably stays within range (the dtype's range is tried
      first, with no pass over the data); True when it might not.
    """
    value_min, value_max, acc_min, acc_max = _ranges(x.dtype)
    low = acc_min if low is None else low
    high = acc_max if high is None else high
    n = x.shape[0]
    if n * value_max <= high and n * value_min >= low:
        return False  # e.g. int8..int32 into int64: settled by the dtype alone
    if x.size == 0:
        return False
    least = int(np.minimum.reduce(x, axis=None))
    most = int(np.maximum.reduce(x, axis=None))
    return bool(n * most > high or n * least < low)


def _split_sums(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(H, rem)`` per position with ``sum(x, axis=0) == H * 2**32 + rem`` exactly,
    ``0 <= rem < 2**32``; in the accumulator dtype. Exact for ``n < 2**31``."""
    acc = _accumulator(x.dtype)
    wide = x.astype(acc, copy=False)
    shift = acc.type(_HALF)
    mask = acc.type(_LOW_MASK)
    high = np.add.reduce(wide >> shift, axis=0)  # |.| <= n * 2**31
    low = np.add.reduce(wide & mask, axis=0)  # <= n * (2**32 - 1)
    return high + (low >> shift), low & mask


def int_sum_exact(
    x: np.ndarray, low: int | None = None, high: int | None = None
) -> tuple[Any, int]:
    """The sum over axis 0 of integer ``x`` and how many positions leave ``[low, high]``.

    Args:
      x: ``[n, ...]`` integer array.
      low, high: the range the sums must stay in; default the accumulator's.

    Returns:
      ``(sum, outside)``: ``sum`` in the accumulator dtype (``int64``/``uint64``), exact
      at every position whose exact sum fits it; ``outside`` counts the positions whose
      exact sum is outside ``[low, high]`` (or does not fit the accumulator at all).
    """
    acc = _accumulator(x.dtype)
    info = np.iinfo(acc)
    wrapped = np.add.reduce(x, axis=0, dtype=acc)
    if x.shape[0] >= 2**31:  # beyond the split's exactness: Python integers
        exact = np.add.reduce(x.astype(object), axis=0)
        lo, hi = (info.min if low is None else low), (info.max if high is None else high)
        bad = np.vectorize(lambda v: not lo <= v <= hi, otypes=[bool])(exact)
        return wrapped, int(np.count_nonzero(bad))
    high_part, _ = _split_sums(x)
    if acc.kind == "i":
        bad = (high_part < -(2 ** (_HALF - 1))) | (high_part > 2 ** (_HALF - 1) - 1)
    else:
        bad = high_part > _LOW_MASK
    if low is not None and low > info.min:
        bad = bad | (wrapped < low)
    if high is not None and high < info.max:
        bad = bad | (wrapped > high)
    return wrapped, int(np.count_nonzero(bad))


def int_mean_exact(x: np.ndarray) -> Any:
    """The mean over axis 0 of integer ``x`` as float64, from the exact sum: within one
    unit in the last place of the exact mean, also where the sum passes 64 bits.

    Args:
      x: ``[n, ...]`` integer array with ``0 < n < 2**31``.

    Returns:
      float64 array of shape ``x.shape[1:]`` (a 0-d array for 1-D ``x``).
    """
    n = x.shape[0]
    acc = _accumulator(x.dtype)
    high, rem = _split_sums(x)
    count = acc.type(n)
    # sum = H * 2**32 + rem = (qh * n + rh) * 2**32 + rem, so with
    # rh * 2**32 + rem = qt * n + rt (it fits: below n * 2**32 + 2**32):
    # sum / n = (qh * 2**32 + qt) + rt / n, an exact integer part (floor(sum / n), which
    # fits the accumulator; computed modulo 2**64, so a wrapping intermediate cancels)
    # plus a fraction in [0, 1): the only roundings are float(integer part) and the sum.
    qh, rh = np.divmod(np.asarray(high), count)
    qt, rt = np.divmod(rh * acc.type(1 << _HALF) + rem, count)
    with np.errstate(over="ignore"):
        whole = qh * acc.type(1 << _HALF) + qt
        total = high * acc.type(1 << _HALF) + rem  # the exact sum where it fits
    fits = (high >= -(2 ** (_HALF - 1))) & (high <= 2 ** (_HALF - 1) - 1)
    if acc.kind == "u":
        fits = high <= _LOW_MASK
    # Where the sum fits, float(sum) / n (two roundings, no cancellation: the integer part
    # plus a fraction would cancel for a mean such as -0.2 = -1 + 0.8); where it does not,
    # |mean| >= 2**63 / n and the fraction is far below the integer part's last place.
    return np.where(
        fits, total.astype(np.float64) / n, whole.astype(np.float64) + rt.astype(np.float64) / n
    )


def _scale_bits(n: int) -> int:
    return max(1, (n - 1).bit_length())


def scaled_sum(x: np.ndarray, dtype: Any = None) -> Any:
    """``sum(x, axis=0)`` computed on ``x * 2**-k`` (``2**k >= n``) and scaled back: no
    partial sum passes ``max |x|``, so the result is inf only where the true sum is."""
    k = _scale_bits(x.shape[0])
    return np.ldexp(np.add.reduce(np.ldexp(x, -k), axis=0, dtype=dtype), k)


def scaled_mean(x: np.ndarray, count: Any, dtype: Any = None) -> Any:
    """``sum(x, axis=0) / count`` as :func:`scaled_sum` computes it, divided before scaling
    back (so a representable mean of huge values stays finite)."""
    k = _scale_bits(x.shape[0])
    return np.ldexp(np.add.reduce(np.ldexp(x, -k), axis=0, dtype=dtype) / count, k)


def all_finite(value: Any) -> bool:
    """Every entry of a reduced value is finite (cheap for the scalars most metrics give)."""
    if isinstance(value, np.ndarray):
        return bool(np.isfinite(value).all())
    return math.isfinite(value)


__all__ = [
    "FLOAT_EXACT",
    "all_finite",
    "int_mean_exact",
    "int_sum_exact",
    "int_sum_may_overflow",
    "scaled_mean",
    "scaled_sum",
]
