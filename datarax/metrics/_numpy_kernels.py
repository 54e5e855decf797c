"""The NumPy reduction kernels: one stacked ``[n_devices, ...]`` array reduced over its
leading (device) axis. NumPy only (no JAX anywhere in the import closure); used by
:mod:`datarax.metrics.reductions` for NumPy leaves and, through it, by
:mod:`datarax.distributed.metrics`. Two of the helpers (:func:`omit_reduce`,
:func:`omit_weighted_mean`) take the array module ``xp`` so that the JAX kernel in
:mod:`datarax.metrics._reduce_kernels` runs the same formulas with ``jnp``.

Semantics (dtypes, exact integer sums, finite float sums, ``nan_policy``) are documented
in :mod:`datarax.distributed.metrics`; the exact and overflow-free arithmetic itself is in
:mod:`datarax.metrics._exact_reductions`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from datarax.errors import MetricsError
from datarax.metrics._exact_reductions import (
    FLOAT_EXACT,
    all_finite,
    int_mean_exact,
    int_sum_exact,
    int_sum_may_overflow,
    scaled_mean,
    scaled_sum,
)

__all__ = [
    "integer_overflow",
    "is_inexact",
    "named_error",
    "normalised",
    "omit_reduce",
    "omit_weighted_mean",
    "reduce_numpy",
    "reduce_numpy_dict",
]


def is_inexact(dtype: Any) -> bool:
    """Floating or complex, the ml_dtypes floats (bfloat16, float8_*, ...) included: what
    ``jnp.issubdtype(dtype, jnp.inexact)`` answers, without JAX (tested against it for
    every ml_dtypes type in tests/datarax/metrics/test_reduce_kernels.py)."""
    kind = np.dtype(dtype).kind
    if kind in "fc":
        return True
    if kind != "V":
        return False  # ml_dtypes' complex32 is kind "W", which JAX does not count
    # ml_dtypes' floats and small integers are kind "V" (so are structured dtypes);
    # ml_dtypes is NumPy only, and loads only for such a dtype.
    import ml_dtypes

    finfo: Callable[[object], object] = ml_dtypes.finfo  # untyped; raises for non-floats
    try:
        finfo(dtype)
    except ValueError:
        return False
    return True


def named_error(err: MetricsError, name: str) -> MetricsError:
    """``err`` with the metric it is about named first (kernels do not know names)."""
    return MetricsError(err.code, f"metric {name!r}: {err.message}")


_FLOAT64 = np.dtype(np.float64)
_FLOAT32 = np.dtype(np.float32)
_FLOAT32_EXACT = 2**24
"""float32 holds every device count up to this exactly."""


def _numpy_mean(x: NDArray[Any], axis: int = 0) -> Any:
    """``np.mean(x, axis=0)`` of an ndarray with ``x.shape[0] > 0``: numpy's own ``_mean``
    steps (float64 sums of integers, float32 sums of float16, division by an ``intp``
    count) without its Python wrapper, so the results are bit-identical (tested against
    ``np.mean`` for every dtype in tests/datarax/metrics/test_reductions.py).

    Kept because it is measurably faster for the small stacked metrics the service
    reduces (numpy 2.5.5, Python 3.12, 2-core CPU, best of 5 x 20,000 calls of each on
    the same array, e.g. ``python -m timeit -s "import numpy as np; from
    datarax.metrics.reductions import _numpy_mean; x = np.ones(8)"
    "_numpy_mean(x)"`` against ``"np.mean(x, axis=0)"``): [8] float64 2.88 -> 0.73 us,
    [8] float32 4.12 -> 3.02 us, [8] int64 3.15 -> 1.98 us, [8, 1024] float32
    6.76 -> 5.52 us; equal at [64, 4096] float32 (37.5 vs 36.3 us)."""
    dtype = x.dtype
    if dtype is _FLOAT64 and x.ndim == 1:
        # float64 sum / count, as np.mean divides it (float64 by intp), minus its wrappers.
        return np.add.reduce(x, axis=0) / x.shape[0]
    count = np.intp(x.shape[axis])
    if dtype.kind in "biu":
        total = np.add.reduce(x, axis=axis, dtype=np.float64)
    elif dtype == np.float16:
        total = np.add.reduce(x, axis=axis, dtype=np.float32)
    else:
        total = np.add.reduce(x, axis=axis)
    if isinstance(total, np.ndarray):
        if total.dtype is _FLOAT32 and count <= _FLOAT32_EXACT:
            # np.mean divides in float64 (float32 by intp) and rounds to float32; a float32
            # division gives the same bits (a correctly rounded quotient, rounded twice
            # through a format of at least 2 * 24 + 2 bits, is rounded once), without a
            # float64 pass over the result (0.6 -> 0.07 ms for 1M values).
            total = np.true_divide(total, np.float32(count), out=total)
        else:
            total = np.true_divide(total, count, out=total, casting="unsafe")
        return dtype.type(total) if dtype == np.float16 else total
    if dtype == np.float16:
        return dtype.type(total / count)
    return total.dtype.type(total / count)


_SMALL = 64
"""Up to this many devices, a 1-D integer metric is summed as Python integers."""
_SUM_DTYPES = {"i": np.dtype(np.int64), "u": np.dtype(np.uint64)}
_ACC_RANGE = {"i": (-(2**63), 2**63 - 1), "u": (0, 2**64 - 1)}


def integer_overflow(shape: tuple[int, ...], dtype: Any, outside: int, result: Any) -> MetricsError:
    """The ``integer_overflow`` error of a sum over ``shape[0]`` devices into ``result``."""
    positions = max(1, int(np.prod(shape[1:])))
    return MetricsError(
        "integer_overflow",
        f"the exact sum over {shape[0]} devices of {np.dtype(dtype)} values does not fit "
        f"{np.dtype(result)} ({np.iinfo(result).min}..{np.iinfo(result).max}) at {outside} "
        f"of {positions} position(s); integer sums are exact or refused: send the values "
        "as floats (a rounded sum), or sum fewer devices at a time.",
    )


def _numpy_sum(x: NDArray[Any]) -> Any:
    """``np.add.reduce(x, axis=0)``, but exact or refused for integers and finite for
    floats wherever the true sum is (see :mod:`datarax.metrics._exact_reductions`).
    The common case costs one check: the dtype's range for small integers, the result's
    finiteness for floats, one max and one min pass for 64-bit integers.

    Raises:
      MetricsError: ``integer_overflow``.
    """
    kind = x.dtype.kind
    if kind in "iu":
        if x.ndim == 1 and x.shape[0] <= _SMALL:
            total = sum(x.tolist())  # exact Python integers: cheaper than any bound
            acc = _SUM_DTYPES[kind]
            if not _ACC_RANGE[kind][0] <= total <= _ACC_RANGE[kind][1]:
                raise integer_overflow(x.shape, x.dtype, 1, acc)
            return acc.type(total)
        if not int_sum_may_overflow(x):
            return np.add.reduce(x, axis=0)
        out, outside = int_sum_exact(x)
        if outside:
            raise integer_overflow(x.shape, x.dtype, outside, out.dtype)
        return out
    out = np.add.reduce(x, axis=0)
    if kind == "f" and not all_finite(out):
        out = _finite_where_possible(out, scaled_sum(x))
    return out


def _safe_mean(x: NDArray[Any]) -> Any:
    """:func:`_numpy_mean`, but from the exact sum for integers whose float64 sum could
    lose bits, and finite for floats wherever the true mean is."""
    if x.dtype is _FLOAT64 and x.ndim == 1:
        # The most common metric, [n_devices] float64: _numpy_mean's own first case and
        # the finiteness check below, without their calls.
        out = np.add.reduce(x, axis=0) / x.shape[0]
        if math.isfinite(out):
            return out
        return _finite_where_possible(out, scaled_mean(x, x.shape[0]))
    kind = x.dtype.kind
    if kind in "iu":
        if x.ndim == 1 and x.shape[0] <= _SMALL:
            # int / int is correctly rounded; equal to the float64 sum / n wherever that
            # one is exact (every sum below 2**53).
            return np.float64(sum(x.tolist()) / x.shape[0])
        if not int_sum_may_overflow(x, -FLOAT_EXACT, FLOAT_EXACT):
            return _numpy_mean(x)  # every partial sum is an exact float64 integer
        out = int_mean_exact(x)
        return out[()] if out.ndim == 0 else out
    out = _numpy_mean(x)
    if kind == "f" and not all_finite(out):
        acc = np.float32 if x.dtype == np.float16 else None
        out = _finite_where_possible(out, scaled_mean(x, x.shape[0], dtype=acc))
    return out


def _finite_where_possible(out: Any, fixed: Any) -> Any:
    """``out`` where finite, else the overflow-free ``fixed`` (non-finite again where an
    input was NaN or inf), in ``out``'s dtype."""
    dtype = np.result_type(out)
    merged = np.where(np.isfinite(out), out, fixed).astype(dtype)
    return merged[()] if merged.ndim == 0 else merged


# np.sum/max/min on an ndarray are these ufunc reductions behind a Python wrapper (sum
# and mean with the overflow checks above).
_NUMPY_REDUCTIONS: dict[str, Callable[..., Any]] = {
    "mean": _safe_mean,
    "sum": _numpy_sum,
    "max": np.maximum.reduce,
    "min": np.minimum.reduce,
}


def normalised(w: Any) -> Any:
    """Weights scaled to sum to 1, by their maximum first: ``w / w.sum()`` alone is 0 for
    ``[1e308, 1e308]`` (the sum overflows), and a weighted mean must not depend on the
    weights' scale. ``max > 0`` holds for validated (and, by contract, traced) weights."""
    w = w / w.max()
    return w / w.sum()


def omit_weighted_mean(xp: Any, x: Any, wn: Any, dtype: Any) -> Any:
    """Weighted mean of the finite entries per position; ``xp`` is ``np`` or ``jnp``.

    ``wn`` is ``[n_devices, 1, ...]`` normalised weights in ``dtype``; a position with no
    finite entry of non-zero weight is NaN.
    """
    finite = xp.isfinite(x)
    wf = xp.where(finite, wn, 0)
    num = xp.sum(wf * xp.where(finite, x, 0), axis=0)
    den = xp.sum(wf, axis=0)
    return xp.where(den > 0, num / xp.where(den > 0, den, 1), xp.nan).astype(dtype)


def omit_reduce(xp: Any, x: Any, op: str) -> Any:
    """Unweighted ``op`` over the finite entries per position of floating ``x``; ``xp``
    is ``np`` or ``jnp``. A position with nothing finite is NaN. NumPy sums and means
    are finite wherever the true value is; JAX keeps XLA's plain reduction here."""
    finite = xp.isfinite(x)
    count = xp.sum(finite, axis=0)
    fill = {"mean": 0, "sum": 0, "max": -xp.inf, "min": xp.inf}[op]
    kept = xp.where(finite, x, fill)
    if op == "mean":
        denominator = xp.where(count > 0, count, 1).astype(x.dtype)
        out = xp.sum(kept, axis=0) / denominator
        if xp is np and x.dtype.kind == "f" and not all_finite(out):
            out = _finite_where_possible(out, scaled_mean(kept, denominator))
    else:
        out = {"sum": xp.sum, "max": xp.max, "min": xp.min}[op](kept, axis=0)
        if op == "sum" and xp is np and x.dtype.kind == "f" and not all_finite(out):
            out = _finite_where_possible(out, scaled_sum(kept))
    return xp.where(count > 0, out, xp.nan).astype(x.dtype)


def reduce_numpy(x: NDArray[Any], op: str, w: NDArray[Any] | None, nan_policy: str) -> Any:
    """Reduces the leading axis of one NumPy array with ``ndim >= 1`` (inputs validated,
    ``w`` float64 weights or None, floating-point warnings silenced by the caller)."""
    if x.dtype == np.bool_:
        x = x.astype(np.int_)  # bools count as NumPy's default int
    inexact = is_inexact(x.dtype)
    if op == "mean" and w is not None:
        dtype = x.dtype if inexact else _FLOAT64
        wn = normalised(w).astype(dtype).reshape((-1,) + (1,) * (x.ndim - 1))
        if x.dtype != dtype:
            x = x.astype(dtype)
        if nan_policy == "omit" and inexact:
            return omit_weighted_mean(np, x, wn, dtype)
        return np.tensordot(wn.reshape(-1), x, axes=(0, 0))  # BLAS, no [n, ...] temp
    if nan_policy != "omit" or not inexact:
        return _NUMPY_REDUCTIONS[op](x)
    return omit_reduce(np, x, op)


def reduce_numpy_dict(
    metrics: Mapping[str, NDArray[Any]],
    ops: Mapping[str, str],
    w: NDArray[Any] | None,
    nan_policy: str,
) -> dict[str, Any]:
    """Reduces a validated flat ``{name: np.ndarray}`` with op names: the results of the
    tree path, without a tree walk and an ``errstate`` per metric."""
    out: dict[str, Any] = {}
    # Unweighted propagate: reduce_numpy would pick exactly the plain ufunc reduction
    # for every dtype but bool; called directly for small inputs, where call overhead is
    # the cost.
    plain = w is None and nan_policy == "propagate"
    with np.errstate(all="ignore"):
        for name, x in metrics.items():
            if x.ndim == 0:
                out[name] = x
                continue
            try:
                if plain and x.dtype.kind != "b":
                    value = _NUMPY_REDUCTIONS[ops[name]](x)  # axis 0: the ufuncs' default
                else:
                    value = reduce_numpy(x, ops[name], w, nan_policy)
            except MetricsError as err:
                raise named_error(err, name) from None
            out[name] = value[()] if type(value) is np.ndarray and value.ndim == 0 else value
    return out
