"""Reductions of stacked per-device metrics.

A *stacked* metric has the device axis first: ``loss: [n_devices]`` reduces to a
scalar, ``per_class: [n_devices, k]`` to ``[k]``. Two families:

* SPMD reductions (:func:`reduce_mean`, :func:`reduce_sum`, :func:`reduce_max`,
  :func:`reduce_min`, :func:`reduce_custom`, :func:`reduce_over_devices`) take global
  arrays. They work eagerly and inside ``jax.jit``/``nnx.jit`` under ``jax.set_mesh``,
  where a device axis sharded over ``'data'`` makes XLA insert the all-reduce.
* Collective reductions (:func:`reduce_mean_collective`, :func:`reduce_sum_collective`,
  :func:`all_gather`) call ``lax.pmean``/``psum``/``all_gather`` and are only valid
  inside ``jax.pmap`` or ``jax.shard_map`` with a matching ``axis_name``.

The backend is chosen per leaf: ``np.ndarray`` in, NumPy out, computed with NumPy (no
``jnp``, no ``device_put``, so a process that only reduces NumPy arrays never starts a
JAX backend); ``jax.Array`` or tracer in, ``jax.Array`` out. NumPy scalar results are
``np.generic`` (``np.float64(1.0)``), never 0-d arrays.

Leaves: ``np.ndarray`` and ``jax.Array`` (tracers included) are arrays. When
``metrics`` is a mapping, each *top-level value* that is a plain ``list``/``tuple`` of
numbers (nested lists allowed) is read as ``np.asarray(value)``; deeper lists stay pytree
nodes. 0-d arrays, Python/NumPy scalars, strings and ``None`` pass through unchanged.

Dtypes: ``sum``/``max``/``min`` keep integer kinds (``sum`` widens small integers the way
NumPy/JAX do: ``int64`` for NumPy, JAX's default int for JAX); bools count as integers.
``mean`` keeps floating dtypes (float32 stays float32) and turns integers and bools into
float64 (NumPy) or JAX's default float (float32 unless ``jax_enable_x64``).

``nan_policy``: ``"propagate"`` (plain arithmetic; NumPy floating-point warnings are
silenced, non-finite results show in the values), ``"omit"`` (NaN and ±inf entries are
dropped per position, together with their weights; a position with nothing finite gives
NaN), ``"raise"`` (any non-finite entry is a :class:`MetricsError`; not possible on traced
floating values, see :class:`MetricsError` code ``nan_policy_traced``).

An empty tree (no leaves at all) is ``empty_metrics``, so a service can turn it into a 422.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from numbers import Number
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

ReduceOp = Literal["mean", "sum", "max", "min"]
NanPolicy = Literal["propagate", "omit", "raise"]

REDUCE_OPS: tuple[str, ...] = ("mean", "sum", "max", "min")
NAN_POLICIES: tuple[str, ...] = ("propagate", "omit", "raise")

_ROOT = "<metrics>"


class MetricsError(ValueError):
    """A metrics reduction could not run; ``code`` says why, in snake_case.

    Codes: ``unknown_reduce_op``, ``unknown_nan_policy``, ``non_finite_values``,
    ``weights_mismatch``, ``invalid_weights``, ``device_count_mismatch``,
    ``empty_metrics``, ``unknown_metric``, ``ragged_array`` (a list metric that is not
    rectangular), ``nan_policy_traced`` (``nan_policy="raise"`` on a traced floating
    value) and ``unbound_axis_name`` (a collective outside ``pmap``/``shard_map``).

    Attributes:
      code: machine-readable reason, e.g. ``"weights_mismatch"``.
      message: human-readable text naming the value received and the fix.
    """

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


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
    if not np.all(np.isfinite(w)) or np.any(w < 0) or not w.sum() > 0:
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
    count) without its Python wrapper, so the results are bit-identical."""
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


# np.sum/max/min on an ndarray are these ufunc reductions behind a Python wrapper.
_NUMPY_REDUCTIONS: dict[str, Callable[..., Any]] = {
    "mean": _numpy_mean,
    "sum": np.add.reduce,
    "max": np.maximum.reduce,
    "min": np.minimum.reduce,
}


def _reduce_with(xp: Any, x: Any, op: str, w: Any, nan_policy: str) -> Any:
    """Shared NumPy/JAX kernel; ``xp`` is ``np`` or ``jnp``."""
    if x.dtype == np.bool_:
        x = x.astype(_int_dtype(x))
    inexact = _is_inexact(x.dtype)
    weighted = op == "mean" and w is not None

    if weighted:
        dtype = _mean_dtype(x)
        wn = w / w.sum()  # float64 for NumPy (validated); normalising keeps it in range
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
            return _NUMPY_REDUCTIONS[op](x, axis=0)
        return {"mean": xp.mean, "sum": xp.sum, "max": xp.max, "min": xp.min}[op](x, axis=0)

    finite = xp.isfinite(x)
    count = xp.sum(finite, axis=0)
    fill = {"mean": 0, "sum": 0, "max": -xp.inf, "min": xp.inf}[op]
    kept = xp.where(finite, x, fill)
    if op == "mean":
        out = xp.sum(kept, axis=0) / xp.where(count > 0, count, 1).astype(x.dtype)
    else:
        out = {"sum": xp.sum, "max": xp.max, "min": xp.min}[op](kept, axis=0)
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
            if plain and x.dtype.kind != "b":
                value = _NUMPY_REDUCTIONS[ops[name]](x, axis=0)
            else:
                value = _reduce_with(np, x, ops[name], w, nan_policy)
            out[name] = value[()] if type(value) is np.ndarray and value.ndim == 0 else value
    return out


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


# --------------------------------------------------------------------- public API


def reduce_over_devices(
    values: Any,
    op: str = "mean",
    *,
    weights: Any = None,
    nan_policy: str = "propagate",
) -> Any:
    """Reduces one stacked array over its leading (device) axis.

    Args:
      values: ``[n_devices]`` or ``[n_devices, ...]`` array; NumPy, ``jax.Array`` (may be
        sharded over ``'data'``) or a tracer; a plain list of numbers is read as a NumPy
        array. 0-d arrays, scalars and non-arrays are returned unchanged.
      op: one of ``"mean"``, ``"sum"``, ``"max"``, ``"min"``.
      weights: ``[n_devices]`` non-negative finite weights, not all zero (e.g. per-device
        batch sizes for an uneven last batch); only valid with ``op="mean"``, which then
        gives ``sum_i w_i x_i / sum_i w_i``. Traced weights are checked for shape only.
      nan_policy: ``"propagate"``, ``"omit"`` or ``"raise"`` (see module doc).

    Returns:
      ``values`` reduced to shape ``values.shape[1:]``: NumPy in gives ``np.ndarray`` or
      ``np.generic``; JAX in gives ``jax.Array``. Dtypes follow the module doc.

    Raises:
      MetricsError: codes ``unknown_reduce_op``, ``unknown_nan_policy``,
        ``invalid_weights`` (also weights with an op other than mean),
        ``weights_mismatch``, ``empty_metrics`` (0 devices), ``ragged_array``,
        ``non_finite_values``, ``nan_policy_traced``.

    Example:
      >>> reduce_over_devices(np.array([[1.0, 2.0], [3.0, 4.0]]), "max")
      array([3., 4.])
    """
    _check_nan_policy(nan_policy)
    _check_op(op)
    if weights is not None and op != "mean":
        raise MetricsError(
            "invalid_weights",
            f"weights apply only to op='mean', got op={op!r}; drop the weights or use mean.",
        )
    values = _list_to_array("values", values)
    if not _is_array(values) or values.ndim == 0:
        return values
    named = [("values", values)]
    w = _check_weights(weights, _device_count(named))
    if nan_policy == "raise":
        _check_finite("values", values)
    return _reduce_array(values, op, w, nan_policy)


def reduce_mean(metrics: Any, *, weights: Any = None, nan_policy: str = "propagate") -> Any:
    """Mean over the device axis of every stacked metric in a pytree.

    Args:
      metrics: pytree (usually ``{name: [n_devices, ...] array}``); all array leaves with
        ``ndim >= 1`` share ``n_devices``. See the module doc for lists and scalars.
      weights: optional ``[n_devices]`` weights for a weighted mean (uneven batches).
      nan_policy: ``"propagate"``, ``"omit"`` or ``"raise"``.

    Returns:
      The same structure with each ``[n_devices, ...]`` leaf reduced to ``[...]``; a
      mapping whose top-level lists were read as arrays comes back as a ``dict``.

    Raises:
      MetricsError: ``empty_metrics``, ``device_count_mismatch``, ``invalid_weights``,
        ``weights_mismatch``, ``unknown_nan_policy``, ``non_finite_values``,
        ``nan_policy_traced``, ``ragged_array``.

    Example:
      >>> reduce_mean({"loss": np.array([1.0, 3.0])}, weights=[3, 1])
      {'loss': np.float64(1.5)}
    """
    prepared, w = _validate(metrics, weights, nan_policy)
    return _apply(prepared, "mean", w, nan_policy)


def reduce_sum(metrics: Any, *, nan_policy: str = "propagate") -> Any:
    """Sum over the device axis of every stacked metric; see :func:`reduce_mean`.

    Args:
      metrics: pytree of ``[n_devices, ...]`` arrays.
      nan_policy: ``"propagate"``, ``"omit"`` or ``"raise"``.

    Returns:
      The same structure with each leaf reduced to ``[...]``; integers stay integers.

    Raises:
      MetricsError: as :func:`reduce_mean`, without the weights codes.
    """
    prepared, w = _validate(metrics, None, nan_policy)
    return _apply(prepared, "sum", w, nan_policy)


def reduce_max(metrics: Any, *, nan_policy: str = "propagate") -> Any:
    """Maximum over the device axis of every stacked metric; see :func:`reduce_sum`."""
    prepared, w = _validate(metrics, None, nan_policy)
    return _apply(prepared, "max", w, nan_policy)


def reduce_min(metrics: Any, *, nan_policy: str = "propagate") -> Any:
    """Minimum over the device axis of every stacked metric; see :func:`reduce_sum`."""
    prepared, w = _validate(metrics, None, nan_policy)
    return _apply(prepared, "min", w, nan_policy)


def reduce_custom(
    metrics: Mapping[str, Any],
    reduce_fn: Mapping[str, str | Callable[[Any], Any]] | None = None,
    *,
    weights: Any = None,
    nan_policy: str = "propagate",
) -> dict[str, Any]:
    """Reduces each top-level metric with its own operation.

    Args:
      metrics: mapping ``{name: [n_devices, ...] array or subtree}``.
      reduce_fn: ``{name: op}``; ``op`` is ``"mean"``, ``"sum"``, ``"max"``, ``"min"`` or
        a callable applied to each stacked ``[n_devices, ...]`` array leaf under that name
        (the callable owns its NaN handling and ignores weights; ``nan_policy="raise"``
        still checks its input). Names not listed use ``"mean"``.
      weights: optional ``[n_devices]`` weights; they affect only ``"mean"`` metrics,
        ``sum``/``max``/``min`` ignore them.
      nan_policy: ``"propagate"``, ``"omit"`` or ``"raise"``.

    Returns:
      ``dict`` with the same keys, each value reduced over its leading axis.

    Raises:
      MetricsError: ``unknown_reduce_op`` (an op string not in ``REDUCE_OPS``),
        ``unknown_metric`` (a ``reduce_fn`` name missing from ``metrics``), plus the
        codes of :func:`reduce_mean`.

    Example:
      >>> reduce_custom(
      ...     {"loss": np.array([1.0, 3.0]), "step": np.array([10, 10])},
      ...     reduce_fn={"loss": "mean", "step": "max"},
      ... )
      {'loss': np.float64(2.0), 'step': np.int64(10)}
    """
    ops = _plain_numpy_ops(metrics, reduce_fn, weights, nan_policy)
    if ops is not None:
        return _reduce_numpy_dict(metrics, ops, None, nan_policy)
    _check_nan_policy(nan_policy)
    reduce_fn = {} if reduce_fn is None else reduce_fn
    if not isinstance(reduce_fn, Mapping):
        raise MetricsError(
            "unknown_reduce_op",
            f"reduce_fn must map metric names to ops, got {type(reduce_fn).__name__}; "
            'pass e.g. {"loss": "mean", "step": "max"}.',
        )
    for name, op in reduce_fn.items():
        if not callable(op):
            _check_op(op, name)
    if not isinstance(metrics, Mapping):
        if not reduce_fn:
            return reduce_mean(metrics, weights=weights, nan_policy=nan_policy)
        raise MetricsError(
            "unknown_metric",
            f"reduce_fn names {sorted(map(str, reduce_fn))} but metrics is a "
            f"{type(metrics).__name__}, not a mapping of names; pass a dict of metrics.",
        )
    missing = [k for k in reduce_fn if k not in metrics]
    if missing:
        raise MetricsError(
            "unknown_metric",
            f"reduce_fn names {missing}, which are not in metrics "
            f"(available: {sorted(map(str, metrics))}); fix the names or drop them.",
        )
    prepared, w = _validate(metrics, weights, nan_policy)
    if _flat_numpy_dict(prepared) and (w is None or type(w) is np.ndarray):
        ops = {k: reduce_fn.get(k, "mean") for k in prepared}
        if all(type(op) is str for op in ops.values()):
            return _reduce_numpy_dict(prepared, ops, w, nan_policy)
    return {k: _apply(v, reduce_fn.get(k, "mean"), w, nan_policy) for k, v in prepared.items()}


def collect_from_devices(metrics: Any) -> list[Any]:
    """Splits stacked metrics into one pytree per device.

    Args:
      metrics: pytree of ``[n_devices, ...]`` arrays (lists read as in the module doc).

    Returns:
      List of length ``n_devices``; entry ``i`` has the structure of ``metrics`` with
      each stacked leaf replaced by ``leaf[i]`` (``[...]``; NumPy in gives NumPy, JAX
      in gives JAX). Scalars and non-arrays repeat on every device.

    Raises:
      MetricsError: ``empty_metrics`` (no leaves, or no leaf with a device axis),
        ``device_count_mismatch``, ``ragged_array``.

    Example:
      >>> collect_from_devices({"loss": np.array([0.9, 1.1])})
      [{'loss': np.float64(0.9)}, {'loss': np.float64(1.1)}]
    """
    prepared = _lists_to_arrays(metrics)
    named, treedef = _flatten(prepared)
    _check_nonempty(named, metrics)
    n = _device_count(named)
    if n is None:
        raise MetricsError(
            "empty_metrics",
            f"no metric has a device axis (received {metrics!r}); stack each metric as "
            "[n_devices, ...].",
        )
    leaves = [leaf for _, leaf in named]
    if treedef is None:  # a flat {str: np.ndarray}; keys sorted as tree_unflatten gives them
        keys = sorted(prepared)
        return [
            {k: x[i] if x.ndim >= 1 else x for k, x in zip(keys, leaves, strict=True)}
            for i in range(n)
        ]
    return [
        jax.tree_util.tree_unflatten(
            treedef, [x[i] if _is_array(x) and x.ndim >= 1 else x for x in leaves]
        )
        for i in range(n)
    ]


# --------------------------------------------------------------------- collectives


def _collective(fn: Callable[..., Any], metrics: Any, axis_name: Any, what: str) -> Any:
    if not isinstance(axis_name, str) or not axis_name:
        raise MetricsError(
            "unbound_axis_name",
            f"axis_name must be a non-empty string, got {axis_name!r}; use the name given "
            'to jax.pmap(..., axis_name=...) or the mesh axis of shard_map (e.g. "batch").',
        )

    def one(x: Any) -> Any:
        if isinstance(x, (np.ndarray, jax.Array, Number, np.generic)):
            return fn(x, axis_name)
        return x

    try:
        return jax.tree_util.tree_map(one, metrics, is_leaf=_is_none)
    except NameError as err:
        raise MetricsError(
            "unbound_axis_name",
            f"{what} found no mapped axis named {axis_name!r} ({err}); call it inside "
            f"jax.pmap(..., axis_name={axis_name!r}) or jax.shard_map over a mesh with that "
            "axis, or use the SPMD reduce_* functions under jit.",
        ) from err


def reduce_mean_collective(metrics: Any, axis_name: str = "batch") -> Any:
    """``lax.pmean`` of every leaf over a mapped axis (inside ``pmap``/``shard_map``).

    Args:
      metrics: pytree of per-device values (any shape ``[...]``), e.g. gradients.
      axis_name: the ``pmap`` axis name or ``shard_map`` mesh axis, e.g. ``"batch"``.

    Returns:
      Same structure and shapes, each leaf averaged over ``axis_name`` (identical on every
      device). Non-numeric leaves pass through.

    Raises:
      MetricsError: ``unbound_axis_name`` when called outside a context binding it.
    """
    return _collective(lax.pmean, metrics, axis_name, "reduce_mean_collective")


def reduce_sum_collective(metrics: Any, axis_name: str = "batch") -> Any:
    """``lax.psum`` of every leaf over a mapped axis; see :func:`reduce_mean_collective`."""
    return _collective(lax.psum, metrics, axis_name, "reduce_sum_collective")


def all_gather(metrics: Any, axis_name: str = "batch") -> Any:
    """``lax.all_gather`` of every leaf over a mapped axis (inside ``pmap``/``shard_map``).

    Args:
      metrics: pytree of per-device values ``[...]``.
      axis_name: the ``pmap`` axis name or ``shard_map`` mesh axis.

    Returns:
      Same structure, each leaf ``[axis_size, ...]`` holding every device's value, marked
      invariant over ``axis_name`` (so ``shard_map(..., out_specs=P())`` accepts it).

    Raises:
      MetricsError: ``unbound_axis_name`` when called outside a context binding it.
    """
    return _collective(_gather_invariant, metrics, axis_name, "all_gather")


def _gather_invariant(x: Any, axis_name: str) -> Any:
    # "invarying" marks the result as equal on every device, so shard_map's
    # replication check accepts out_specs=P(); plain all_gather stays "varying".
    return lax.all_gather(x, axis_name, to="invarying")
