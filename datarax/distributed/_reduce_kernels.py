"""The machinery behind :mod:`datarax.distributed.metrics`: input checks, the NumPy/JAX
reduction kernels and two NumPy fast paths. Private: import the public names from
``datarax.distributed.metrics``; the semantics (backends, dtypes, ``nan_policy``) are
documented there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from numbers import Number
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from datarax.distributed._exact_reductions import (
    FLOAT_EXACT,
    all_finite,
    int_mean_exact,
    int_sum_exact,
    int_sum_may_overflow,
    scaled_mean,
    scaled_sum,
)
from datarax.distributed.errors import MetricsError

REDUCE_OPS: tuple[str, ...] = ("mean", "sum", "max", "min")
NAN_POLICIES: tuple[str, ...] = ("propagate", "omit", "raise")

_ROOT = "<metrics>"


# --------------------------------------------------------------------------- checks


def _is_array(x: Any) -> bool:
    return isinstance(x, (np.ndarray, jax.Array))


def _is_traced(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def _is_none(x: Any) -> bool:
    return x is None


def _is_inexact(dtype: Any) -> bool:
    """Floating or complex, ml_dtypes (bfloat16, ...) included."""
    kind = np.dtype(dtype).kind
    if kind in "fc":
        return True
    if kind in "biuOSUMm":
        return False
    return bool(jnp.issubdtype(dtype, jnp.inexact))


def _flat_numpy_dict(metrics: Any) -> bool:
    """``{str: np.ndarray}``: the common case, flattened without ``jax.tree_util``."""
    return type(metrics) is dict and all(
        type(k) is str and type(v) is np.ndarray for k, v in metrics.items()
    )


def _check_nan_policy(nan_policy: Any) -> None:
    if not isinstance(nan_policy, str) or nan_policy not in NAN_POLICIES:
        raise MetricsError(
            "unknown_nan_policy",
            f"nan_policy={nan_policy!r} is not supported; use one of {list(NAN_POLICIES)}.",
        )


def _check_op(op: Any, name: str | None = None) -> None:
    if isinstance(op, str) and op in REDUCE_OPS:
        return
    where = f" for metric {name!r}" if name is not None else ""
    raise MetricsError(
        "unknown_reduce_op",
        f"reduce op {op!r}{where} is not supported; use one of {list(REDUCE_OPS)}"
        + (" or a callable on the stacked array." if name is not None else "."),
    )


def _is_number_list(value: Any) -> bool:
    """A non-empty plain list/tuple whose items are numbers or such lists."""
    if type(value) not in (list, tuple) or not value:
        return False
    return all(
        _is_number_list(v) if type(v) in (list, tuple) else isinstance(v, (Number, np.bool_))
        for v in value
    )


def _list_to_array(name: str, value: Any) -> Any:
    if not _is_number_list(value):
        return value
    try:
        return np.asarray(value)
    except ValueError as err:
        raise MetricsError(
            "ragged_array",
            f"metric {name!r} is a ragged list ({err}); every device must send the same "
            "shape, e.g. [[1, 2], [3, 4]] for [n_devices, 2].",
        ) from err


def _lists_to_arrays(metrics: Any) -> Any:
    """Reads top-level list values of a mapping as NumPy arrays (see module doc)."""
    if not isinstance(metrics, Mapping):
        return metrics
    if not any(_is_number_list(v) for v in metrics.values()):
        return metrics
    return {k: _list_to_array(str(k), v) for k, v in metrics.items()}


def _flatten(metrics: Any) -> tuple[list[tuple[str, Any]], Any]:
    if _flat_numpy_dict(metrics):
        # What tree_flatten_with_path gives for a flat dict (keys sorted), without it.
        return [(k or _ROOT, metrics[k]) for k in sorted(metrics)], None
    path_leaves, treedef = jax.tree_util.tree_flatten_with_path(metrics, is_leaf=_is_none)
    named = [
        (jax.tree_util.keystr(path, simple=True, separator="/") or _ROOT, leaf)
        for path, leaf in path_leaves
    ]
    return named, treedef


def _device_count(named: list[tuple[str, Any]]) -> int | None:
    """The shared leading size of all array leaves with ``ndim >= 1`` (None if none)."""
    sizes = {name: leaf.shape[0] for name, leaf in named if _is_array(leaf) and leaf.ndim >= 1}
    if not sizes:
        return None
    if len(set(sizes.values())) > 1:
        listing = ", ".join(f"{k}: {v}" for k, v in sizes.items())
        raise MetricsError(
            "device_count_mismatch",
            f"metrics disagree on the number of devices (leading axis sizes {listing}); "
            "stack every metric as [n_devices, ...] with the same n_devices.",
        )
    n = next(iter(sizes.values()))
    if n == 0:
        raise MetricsError(
            "empty_metrics",
            f"metrics have 0 devices on the leading axis ({', '.join(sizes)}); "
            "send at least one device's values.",
        )
    return n


def _check_nonempty(named: list[tuple[str, Any]], metrics: Any) -> None:
    if not named:
        raise MetricsError(
            "empty_metrics",
            f"no metrics to reduce (received {metrics!r}); pass e.g. "
            '{"loss": losses} with losses shaped [n_devices].',
        )


def _check_weights(weights: Any, n: int | None) -> Any:
    """Validates weights; returns float64 NumPy weights, or the tracer unchanged."""
    if weights is None:
        return None
    if _is_traced(weights):
        # Values are unknown under tracing; only the shape can be checked.
        w = weights
    else:
        w = np.asarray(weights)
        if w.dtype.kind not in "biuf":
            raise MetricsError(
                "invalid_weights",
                f"weights must be real numbers, got dtype {w.dtype}; pass e.g. [32, 32, 16].",
            )
    if w.ndim != 1:
        raise MetricsError(
            "invalid_weights",
            f"weights must be 1-D [n_devices], got shape {tuple(w.shape)}.",
        )
    if n is not None and w.shape[0] != n:
        raise MetricsError(
            "weights_mismatch",
            f"got {w.shape[0]} weights for {n} devices; pass one weight per device "
            "(e.g. its batch size).",
        )
    if _is_traced(w):
        return w
    w = w.astype(np.float64)
    # max, not sum: a sum of huge finite weights overflows (they are scaled by their max).
    if not np.all(np.isfinite(w)) or np.any(w < 0) or not w.max() > 0:
        raise MetricsError(
            "invalid_weights",
            f"weights must be finite, >= 0 and not all zero, got {w.tolist()}.",
        )
    return w


def _check_finite(name: str, x: Any) -> None:
    """For nan_policy='raise': rejects non-finite entries of one array leaf."""
    if not _is_array(x) or x.ndim == 0 or not _is_inexact(x.dtype):
        return
    if _is_traced(x):
        raise MetricsError(
            "nan_policy_traced",
            f"nan_policy='raise' cannot inspect traced values of metric {name!r} inside "
            "jit/pmap/shard_map; use nan_policy='propagate' or 'omit' there, or reduce "
            "outside the compiled function.",
        )
    xp = jnp if isinstance(x, jax.Array) else np
    count = int(xp.count_nonzero(~xp.isfinite(x)))
    if count:
        raise MetricsError(
            "non_finite_values",
            f"metric {name!r} has {count} non-finite value(s) (NaN or inf) in shape "
            f"{tuple(x.shape)}; fix the source or use nan_policy='omit'.",
        )


# ------------------------------------------------------------------------- kernels


def _mean_dtype(x: Any) -> np.dtype:
    """Floating dtypes stay; integers become NumPy float64 or JAX's default float."""
    if _is_inexact(x.dtype):
        return x.dtype
    if isinstance(x, np.ndarray):
        return np.dtype(np.float64)
    return jax.dtypes.canonicalize_dtype(np.float64)


def _int_dtype(x: Any) -> np.dtype:
    """The integer dtype bools are counted in: NumPy int64, JAX's default int."""
    if isinstance(x, np.ndarray):
        return np.dtype(np.int_)
    return jax.dtypes.canonicalize_dtype(np.int64)


def _reduce_array(x: Any, op: str, w: Any, nan_policy: str) -> Any:
    """Reduces the leading axis of one array with ``ndim >= 1`` (inputs validated)."""
    use_jax = (type(x) is not np.ndarray and isinstance(x, jax.Array)) or (
        w is not None and op == "mean" and _is_traced(w)
    )
    if use_jax:
        return _reduce_with(jnp, jnp.asarray(x), op, w, nan_policy)
    with np.errstate(all="ignore"):
        out = _reduce_with(np, x, op, w, nan_policy)
    return out[()] if isinstance(out, np.ndarray) and out.ndim == 0 else out


_FLOAT64 = np.dtype(np.float64)


def _numpy_mean(x: np.ndarray, axis: int = 0) -> Any:
    """``np.mean(x, axis=0)`` of an ndarray with ``x.shape[0] > 0``: numpy's own ``_mean``
    steps (float64 sums of integers, float32 sums of float16, division by an ``intp``
    count) without its Python wrapper, so the results are bit-identical (tested against
    ``np.mean`` for every dtype in tests/datarax/distributed/test_reduce_kernels.py).

    Kept because it is measurably faster for the small stacked metrics the service
    reduces (numpy 2.5.5, Python 3.12, 2-core CPU, best of 5 x 20,000 calls of each on
    the same array, e.g. ``python -m timeit -s "import numpy as np; from
    datarax.distributed._reduce_kernels import _numpy_mean; x = np.ones(8)"
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
        total = np.true_divide(total, count, out=total, casting="unsafe")
        return dtype.type(total) if dtype == np.float16 else total
    if dtype == np.float16:
        return dtype.type(total / count)
    return total.dtype.type(total / count)


_SMALL = 64
"""Up to this many devices, a 1-D integer metric is summed as Python integers."""
_SUM_DTYPES = {"i": np.dtype(np.int64), "u": np.dtype(np.uint64)}
_ACC_RANGE = {"i": (-(2**63), 2**63 - 1), "u": (0, 2**64 - 1)}


def _integer_overflow(x: Any, outside: int, result: Any) -> MetricsError:
    positions = max(1, int(np.prod(x.shape[1:])))
    return MetricsError(
        "integer_overflow",
        f"the exact sum over {x.shape[0]} devices of {x.dtype} values does not fit "
        f"{np.dtype(result)} ({np.iinfo(result).min}..{np.iinfo(result).max}) at {outside} "
        f"of {positions} position(s); integer sums are exact or refused: send the values "
        "as floats (a rounded sum), or sum fewer devices at a time.",
    )


def _numpy_sum(x: np.ndarray) -> Any:
    """``np.add.reduce(x, axis=0)``, but exact or refused for integers and finite for
    floats wherever the true sum is (see :mod:`datarax.distributed._exact_reductions`).
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
                raise _integer_overflow(x, 1, acc)
            return acc.type(total)
        if not int_sum_may_overflow(x):
            return np.add.reduce(x, axis=0)
        out, outside = int_sum_exact(x)
        if outside:
            raise _integer_overflow(x, outside, out.dtype)
        return out
    out = np.add.reduce(x, axis=0)
    if kind == "f" and not all_finite(out):
        out = _finite_where_possible(out, scaled_sum(x))
    return out


def _safe_mean(x: np.ndarray) -> Any:
    """:func:`_numpy_mean`, but from the exact sum for integers whose float64 sum could
    lose bits, and finite for floats wherever the true mean is."""
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


def _jax_finite_where_possible(x: Any, out: Any, op: str) -> Any:
    """A concrete JAX float sum or mean that overflowed where the true value is finite,
    recomputed on ``x * 2**-k`` (as :func:`scaled_sum`/:func:`scaled_mean`). Costs one
    check of the small result (a host read). Traced values keep XLA's plain reduction: a
    second, always-computed reduction would change every compiled step that reduces
    metrics (and its collectives); so do values this process cannot read whole."""
    if _is_traced(out) or not jnp.issubdtype(out.dtype, jnp.floating):
        return out
    if not getattr(out, "is_fully_addressable", True):
        return out  # a multi-host global value: bool() of it would need every process
    if bool(jnp.all(jnp.isfinite(out))):
        return out
    k = max(1, (x.shape[0] - 1).bit_length())
    total = jnp.sum(jnp.ldexp(x, -k), axis=0)
    fixed = jnp.ldexp(total / x.shape[0] if op == "mean" else total, k).astype(out.dtype)
    return jnp.where(jnp.isfinite(out), out, fixed)


def _check_jax_int_sum(x: Any) -> None:
    """Refuses a concrete JAX integer sum that would wrap (JAX sums in int32 without
    ``jax_enable_x64``). Traced values cannot be inspected and keep JAX's modular
    arithmetic; so do arrays this process cannot read whole (multi-host)."""
    kind = np.dtype(x.dtype).kind
    acc = jax.dtypes.canonicalize_dtype(np.int64 if kind == "i" else np.uint64)
    info, bounds = np.iinfo(x.dtype), np.iinfo(acc)
    n = x.shape[0]
    if n * info.max <= bounds.max and n * info.min >= bounds.min:
        return
    if _is_traced(x) or not getattr(x, "is_fully_addressable", True):
        return
    host = np.asarray(x)
    if not int_sum_may_overflow(host, bounds.min, bounds.max):
        return
    _, outside = int_sum_exact(host, bounds.min, bounds.max)
    if outside:
        raise _integer_overflow(x, outside, acc)


# np.sum/max/min on an ndarray are these ufunc reductions behind a Python wrapper (sum
# and mean with the overflow checks above).
_NUMPY_REDUCTIONS: dict[str, Callable[..., Any]] = {
    "mean": _safe_mean,
    "sum": _numpy_sum,
    "max": np.maximum.reduce,
    "min": np.minimum.reduce,
}


def _normalised(w: Any) -> Any:
    """Weights scaled to sum to 1, by their maximum first: ``w / w.sum()`` alone is 0 for
    ``[1e308, 1e308]`` (the sum overflows), and a weighted mean must not depend on the
    weights' scale. ``max > 0`` holds for validated (and, by contract, traced) weights."""
    w = w / w.max()
    return w / w.sum()


def _reduce_with(xp: Any, x: Any, op: str, w: Any, nan_policy: str) -> Any:
    """Shared NumPy/JAX kernel; ``xp`` is ``np`` or ``jnp``."""
    if x.dtype == np.bool_:
        x = x.astype(_int_dtype(x))
    inexact = _is_inexact(x.dtype)
    weighted = op == "mean" and w is not None

    if weighted:
        dtype = _mean_dtype(x)
        wn = _normalised(w)  # float64 for NumPy (validated); in [0, 1], summing to 1
        wn = xp.asarray(wn).astype(dtype).reshape((-1,) + (1,) * (x.ndim - 1))
        if x.dtype != dtype:
            x = x.astype(dtype)
        if nan_policy == "omit" and inexact:
            finite = xp.isfinite(x)
            wf = xp.where(finite, wn, 0)
            num = xp.sum(wf * xp.where(finite, x, 0), axis=0)
            den = xp.sum(wf, axis=0)
            return xp.where(den > 0, num / xp.where(den > 0, den, 1), xp.nan).astype(dtype)
        if xp is np:
            return np.tensordot(wn.reshape(-1), x, axes=(0, 0))  # BLAS, no [n, ...] temp
        # Multiply-then-sum (not a dot) stays valid on Explicit meshes too.
        return xp.sum(wn * x, axis=0)

    if nan_policy != "omit" or not inexact:
        if xp is np:
            return _NUMPY_REDUCTIONS[op](x)
        if op == "sum" and not inexact:
            _check_jax_int_sum(x)
        out = {"mean": xp.mean, "sum": xp.sum, "max": xp.max, "min": xp.min}[op](x, axis=0)
        if op in ("mean", "sum") and inexact:
            out = _jax_finite_where_possible(x, out, op)
        return out

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


def _plain_numpy_ops(
    metrics: Any, reduce_fn: Any, weights: Any, nan_policy: Any
) -> dict[str, str] | None:
    """``reduce_custom``'s checks for its most common call, all at once: a non-empty
    ``{str: np.ndarray}`` sharing one non-zero device count, known op names for known
    metrics, no weights, ``nan_policy`` propagate or omit. Returns every metric's op, or
    None so the general path runs (and raises whatever error applies)."""
    if weights is not None or (nan_policy != "propagate" and nan_policy != "omit"):
        return None
    if type(metrics) is not dict or not metrics:
        return None
    if reduce_fn is None:
        reduce_fn = {}
    elif type(reduce_fn) is not dict:
        return None
    for name, op in reduce_fn.items():
        if type(op) is not str or op not in REDUCE_OPS or name not in metrics:
            return None
    size = None
    for name, x in metrics.items():  # one pass: _flat_numpy_dict plus one device count
        if type(name) is not str or type(x) is not np.ndarray:
            return None
        if x.ndim:
            if size is None:
                size = x.shape[0]
            elif x.shape[0] != size:
                return None
    if size == 0:
        return None
    return {name: reduce_fn.get(name, "mean") for name in metrics}


def _reduce_numpy_dict(
    metrics: dict[str, np.ndarray], ops: dict[str, str], w: Any, nan_policy: str
) -> dict[str, Any]:
    """``_apply`` over a validated flat ``{name: np.ndarray}`` with op names: the same
    results, without a ``tree_map`` and an ``errstate`` per metric."""
    out: dict[str, Any] = {}
    # Unweighted propagate: _reduce_with would pick exactly the plain ufunc reduction for
    # every dtype but bool; called directly for small inputs, where call overhead is the cost.
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
                    value = _reduce_with(np, x, ops[name], w, nan_policy)
            except MetricsError as err:
                raise named_error(err, name) from None
            out[name] = value[()] if type(value) is np.ndarray and value.ndim == 0 else value
    return out


def named_error(err: MetricsError, name: str) -> MetricsError:
    """``err`` with the metric it is about named first (kernels do not know names)."""
    return MetricsError(err.code, f"metric {name!r}: {err.message}")


def _reduce_leaf(x: Any, op: str | Callable[[Any], Any], w: Any, nan_policy: str) -> Any:
    if not _is_array(x) or x.ndim == 0:
        return x
    if callable(op):
        return op(x)
    return _reduce_array(x, op, w, nan_policy)


def _validate(metrics: Any, weights: Any, nan_policy: str) -> tuple[Any, Any]:
    """Checks a whole tree before any work; returns (tree with lists read, weights)."""
    _check_nan_policy(nan_policy)
    # A flat {str: np.ndarray} has no lists to read.
    prepared = metrics if _flat_numpy_dict(metrics) else _lists_to_arrays(metrics)
    named, _ = _flatten(prepared)
    _check_nonempty(named, metrics)
    w = _check_weights(weights, _device_count(named))
    if nan_policy == "raise":
        for name, leaf in named:
            _check_finite(name, leaf)
    return prepared, w


def _apply(tree: Any, op: str | Callable[[Any], Any], w: Any, nan_policy: str) -> Any:
    if type(tree) is np.ndarray:
        return _reduce_leaf(tree, op, w, nan_policy)  # what tree_map does to one leaf
    return jax.tree_util.tree_map(
        lambda x: _reduce_leaf(x, op, w, nan_policy), tree, is_leaf=_is_none
    )
