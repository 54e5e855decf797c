"""Reductions of stacked per-device metrics held in NumPy arrays, without JAX.

The service's HTTP process reduces only NumPy arrays; this module gives it
:func:`reduce_custom` and :func:`split_by_device` with nothing of JAX in its import
closure (NumPy, the kernels of :mod:`datarax.metrics._numpy_kernels` and the error
types only); this module holds the checks and the tree-level logic.
:mod:`datarax.distributed.metrics` exports the same names for every input (``jax.Array``
and tracers included) and documents the semantics (dtypes, exact integer sums,
``nan_policy``); for NumPy input the two answer identically, because the JAX backend
(:mod:`datarax.metrics._reduce_kernels`) subclasses :class:`NumpyReducer` below and
hands NumPy leaves back to it.

Trees here are made of ``dict`` (keys sorted, as JAX orders them), ``list`` and ``tuple``
nodes; ``None``, scalars, strings and NumPy arrays are leaves. A ``jax.Array`` leaf, or a
container of another type (``nnx.State``, a namedtuple, an ``OrderedDict``), is a JAX
pytree: it is refused with a ``TypeError`` that points at
:mod:`datarax.distributed.metrics`, never reduced differently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from numbers import Number
from typing import Any, TypeGuard, cast

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

from datarax.errors import MetricsError
from datarax.metrics._list_reductions import reduce_number_lists
from datarax.metrics._numpy_kernels import (
    is_inexact,
    named_error,
    reduce_numpy,
    reduce_numpy_dict,
)
from datarax.names import did_you_mean
from datarax.tree_types import MetricOp, NamedLeaves, NanPolicy, PyTree, ReduceOp

__all__ = [
    "NAN_POLICIES",
    "REDUCE_OPS",
    "MetricsError",
    "reduce_custom",
    "reduce_number_lists",
    "split_by_device",
]

REDUCE_OPS: tuple[str, ...] = ("mean", "sum", "max", "min")
NAN_POLICIES: tuple[str, ...] = ("propagate", "omit", "raise")

_ROOT = "<metrics>"
"""The name of a metric that is the whole tree (or sits under an empty key)."""


# --------------------------------------------------------------------------- checks


def flat_numpy_dict(metrics: object) -> TypeGuard[dict[str, NDArray[Any]]]:
    """``{str: np.ndarray}``: the common case, flattened without walking a tree."""
    return type(metrics) is dict and all(
        type(k) is str and type(v) is np.ndarray for k, v in metrics.items()
    )


def check_nan_policy(nan_policy: object) -> None:
    if not isinstance(nan_policy, str) or nan_policy not in NAN_POLICIES:
        raise MetricsError(
            "unknown_nan_policy",
            f"nan_policy={nan_policy!r} is not supported; use one of {list(NAN_POLICIES)}.",
        )


def check_op(op: object, name: str | None = None) -> None:
    if isinstance(op, str) and op in REDUCE_OPS:
        return
    where = f" for metric {name!r}" if name is not None else ""
    raise MetricsError(
        "unknown_reduce_op",
        f"reduce op {op!r}{where} is not supported{did_you_mean(op, REDUCE_OPS)}; use one of "
        f"{list(REDUCE_OPS)}.",
        library_hint=" In Python, a callable on the stacked array also reduces a metric."
        if name is not None
        else "",
    )


def _is_number_list(value: object) -> bool:
    """A non-empty plain list/tuple whose items are numbers or such lists."""
    if not (type(value) is list or type(value) is tuple) or not value:
        return False
    return all(
        _is_number_list(v) if type(v) in (list, tuple) else isinstance(v, (Number, np.bool_))
        for v in value
    )


def list_to_array(name: str, value: Any) -> Any:
    """``value`` as a NumPy array when it is a (nested) list of numbers, else unchanged.

    Raises:
      MetricsError: ``ragged_array``.
    """
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
    return {k: list_to_array(str(k), v) for k, v in metrics.items()}


def _check_nonempty(named: NamedLeaves, metrics: object) -> None:
    if not named:
        raise MetricsError(
            "empty_metrics",
            f"no metrics to reduce (received {metrics!r}); pass e.g. "
            '{"loss": losses} with losses shaped [n_devices].',
        )


def check_weight_shape(shape: tuple[int, ...], n: int | None) -> None:
    """Weights are ``[n_devices]``; checked on concrete and traced weights alike."""
    if len(shape) != 1:
        raise MetricsError(
            "invalid_weights",
            f"weights must be 1-D [n_devices], got shape {tuple(shape)}.",
        )
    if n is not None and shape[0] != n:
        raise MetricsError(
            "weights_mismatch",
            f"got {shape[0]} weights for {n} devices; pass one weight per device "
            "(e.g. its batch size).",
        )


def count_non_finite(name: str, count: int, shape: tuple[int, ...]) -> None:
    """For nan_policy='raise': refuses a leaf with ``count`` non-finite entries."""
    if count:
        raise MetricsError(
            "non_finite_values",
            f"metric {name!r} has {count} non-finite value(s) (NaN or inf) in shape "
            f"{tuple(shape)}; fix the source or use nan_policy='omit'.",
        )


def _plain_numpy_ops(
    metrics: object, reduce_fn: object, weights: object, nan_policy: object
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
    for name, x in metrics.items():  # one pass: flat_numpy_dict plus one device count
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


# --------------------------------------------------------------------------- trees


def _sorted_keys(node: Mapping[Any, Any]) -> list[Any]:
    try:
        return sorted(node)
    except TypeError as err:  # JAX's words for the same refusal
        raise ValueError(
            "Comparator raised exception while sorting pytree dictionary keys."
        ) from err


def _foreign(path: str, kind: str) -> TypeError:
    return TypeError(
        f"{kind} at {path!r}: datarax.metrics.reductions reduces NumPy arrays in "
        "dicts, lists and tuples; use datarax.distributed.metrics for JAX arrays and "
        "other pytrees."
    )


def _walk(node: object, path: tuple[str, ...], out: NamedLeaves) -> None:
    """Appends ``node``'s leaves in JAX's order (dict keys sorted), with their paths."""
    if type(node) is dict:
        for key in _sorted_keys(node):
            _walk(node[key], (*path, str(key)), out)
    elif type(node) is list or type(node) is tuple:
        for i, child in enumerate(node):
            _walk(child, (*path, str(i)), out)
    elif isinstance(node, (Mapping, list, tuple)):
        raise _foreign("/".join(path) or _ROOT, f"a {type(node).__name__} node")
    elif type(node).__module__.partition(".")[0] in ("jax", "jaxlib"):
        raise _foreign("/".join(path) or _ROOT, f"a {type(node).__name__}")
    else:
        out.append(("/".join(path) or _ROOT, node))


def _rebuild(node: object, leaves: Iterator[Any]) -> Any:
    """``node``'s structure with its leaves taken in order from ``leaves``; dicts come
    back with their keys sorted, as ``jax.tree_util.tree_unflatten`` builds them."""
    if type(node) is dict:
        return {key: _rebuild(node[key], leaves) for key in _sorted_keys(node)}
    if type(node) is list:
        return [_rebuild(child, leaves) for child in node]
    if type(node) is tuple:
        return tuple(_rebuild(child, leaves) for child in node)
    return next(leaves)


# ------------------------------------------------------------------------- reducer


class NumpyReducer:
    """The tree-level reductions (validation, per-metric ops, per-device views) over NumPy
    leaves. The leaf and tree hooks (``is_array``, ``flatten``, ``unflatten``,
    ``check_weights``, ``check_finite``, ``reduce_array``) are what a backend changes:
    ``datarax.metrics._reduce_kernels.JaxReducer`` overrides them for ``jax.Array``
    leaves and JAX pytrees and calls these for NumPy ones."""

    # -- hooks

    def is_array(self, x: object) -> bool:
        """An array leaf (reduced over its leading axis when ``ndim >= 1``)."""
        return isinstance(x, np.ndarray)

    def flatten(self, tree: PyTree) -> tuple[NamedLeaves, object]:
        """``(named leaves, structure)``; the structure goes back to :meth:`unflatten`."""
        if flat_numpy_dict(tree):
            return [(k or _ROOT, tree[k]) for k in sorted(tree)], tree
        named: NamedLeaves = []
        _walk(tree, (), named)
        return named, tree

    def unflatten(self, structure: object, leaves: list[Any]) -> PyTree:
        """The tree :meth:`flatten` read ``structure`` from, with ``leaves`` in place."""
        tree: PyTree = _rebuild(structure, iter(leaves))
        return tree

    def map_leaves(self, tree: PyTree, fn: Callable[[Any], Any]) -> PyTree:
        """``tree`` with ``fn`` applied to every leaf (``None`` included)."""
        named, structure = self.flatten(tree)
        return self.unflatten(structure, [fn(leaf) for _, leaf in named])

    def check_weights(self, weights: Any, n: int | None) -> Any:
        """Validates weights; returns float64 NumPy weights (or None)."""
        if weights is None:
            return None
        w = np.asarray(weights)
        if w.dtype.kind not in "biuf":
            raise MetricsError(
                "invalid_weights",
                f"weights must be real numbers, got dtype {w.dtype}; pass e.g. [32, 32, 16].",
            )
        check_weight_shape(w.shape, n)
        w = w.astype(np.float64)
        # max, not sum: a sum of huge finite weights overflows (they are scaled by their max).
        if not np.all(np.isfinite(w)) or np.any(w < 0) or not w.max() > 0:
            raise MetricsError(
                "invalid_weights",
                f"weights must be finite, >= 0 and not all zero, got {w.tolist()}.",
            )
        return w

    def check_finite(self, name: str, x: Any) -> None:
        """For nan_policy='raise': rejects non-finite entries of one array leaf."""
        if not self.is_array(x) or x.ndim == 0 or not is_inexact(x.dtype):
            return
        count_non_finite(name, int(np.count_nonzero(~np.isfinite(x))), x.shape)

    def reduce_array(self, x: Any, op: str, w: Any, nan_policy: str) -> Any:
        """Reduces the leading axis of one array with ``ndim >= 1`` (inputs validated)."""
        with np.errstate(all="ignore"):
            out = reduce_numpy(x, op, w, nan_policy)
        return out[()] if isinstance(out, np.ndarray) and out.ndim == 0 else out

    # -- tree-level

    def device_count(self, named: NamedLeaves) -> int | None:
        """The shared leading size of all array leaves with ``ndim >= 1`` (None if none)."""
        sizes = {
            name: leaf.shape[0] for name, leaf in named if self.is_array(leaf) and leaf.ndim >= 1
        }
        if not sizes:
            return None
        if len(set(sizes.values())) > 1:
            listing = ", ".join(f"{k}: {v}" for k, v in sizes.items())
            raise MetricsError(
                "device_count_mismatch",
                f"metrics disagree on the number of devices (leading axis sizes {listing}); "
                "stack every metric as [n_devices, ...] with the same n_devices.",
            )
        n: int = next(iter(sizes.values()))
        if n == 0:
            raise MetricsError(
                "empty_metrics",
                f"metrics have 0 devices on the leading axis ({', '.join(sizes)}); "
                "send at least one device's values.",
            )
        return n

    def validate(self, metrics: PyTree, weights: Any, nan_policy: str) -> tuple[PyTree, Any]:
        """Checks a whole tree before any work; returns (tree with lists read, weights)."""
        check_nan_policy(nan_policy)
        # A flat {str: np.ndarray} has no lists to read.
        prepared = metrics if flat_numpy_dict(metrics) else _lists_to_arrays(metrics)
        named, _ = self.flatten(prepared)
        _check_nonempty(named, metrics)
        w = self.check_weights(weights, self.device_count(named))
        if nan_policy == "raise":
            for name, leaf in named:
                self.check_finite(name, leaf)
        return prepared, w

    def reduce_leaf(self, x: Any, op: str | Callable[[Any], Any], w: Any, nan_policy: str) -> Any:
        if not self.is_array(x) or x.ndim == 0:
            return x
        if callable(op):
            return op(x)
        return self.reduce_array(x, op, w, nan_policy)

    def apply(
        self, tree: PyTree, op: str | Callable[[Any], Any], w: Any, nan_policy: str
    ) -> PyTree:
        """``op`` over the leading axis of every array leaf of a validated tree."""
        if type(tree) is np.ndarray:
            reduced: PyTree = self.reduce_leaf(tree, op, w, nan_policy)  # as a tree map does
            return reduced
        return self.map_leaves(tree, lambda x: self.reduce_leaf(x, op, w, nan_policy))

    def reduce_custom(
        self,
        metrics: Mapping[str, PyTree],
        reduce_fn: Mapping[str, MetricOp] | None,
        weights: Any,
        nan_policy: str,
    ) -> dict[str, Any]:
        """See :func:`datarax.distributed.metrics.reduce_custom`."""
        ops = _plain_numpy_ops(metrics, reduce_fn, weights, nan_policy)
        if ops is not None:
            # _plain_numpy_ops checked that metrics is a flat {str: np.ndarray}.
            flat = cast("dict[str, NDArray[Any]]", metrics)
            return reduce_numpy_dict(flat, ops, None, nan_policy)
        check_nan_policy(nan_policy)
        reduce_fn = {} if reduce_fn is None else reduce_fn
        if not isinstance(reduce_fn, Mapping):
            raise MetricsError(
                "unknown_reduce_op",
                f"reduce_fn must map metric names to ops, got {type(reduce_fn).__name__}; "
                'pass e.g. {"loss": "mean", "step": "max"}.',
            )
        for name, op in reduce_fn.items():
            if op is not None and not callable(op):
                check_op(op, name)
        if not isinstance(metrics, Mapping):
            if not reduce_fn:
                prepared, w = self.validate(metrics, weights, nan_policy)
                # Not a mapping (typed out, kept for callers without a checker): a mean.
                return self.apply(prepared, "mean", w, nan_policy)
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
        validated, w = self.validate(metrics, weights, nan_policy)
        prepared = cast("Mapping[str, PyTree]", validated)  # validate keeps a mapping one
        leaf_ops = {k: reduce_fn.get(k, "mean") for k in prepared}
        if flat_numpy_dict(prepared) and (w is None or type(w) is np.ndarray):
            str_ops = {k: op for k, op in leaf_ops.items() if type(op) is str}
            if len(str_ops) == len(leaf_ops):
                return reduce_numpy_dict(prepared, str_ops, w, nan_policy)
        out: dict[str, Any] = {}
        for k, v in prepared.items():
            op = leaf_ops[k]
            try:
                out[k] = v if op is None else self.apply(v, op, w, nan_policy)
            except MetricsError as err:
                if err.code != "integer_overflow":
                    raise
                raise named_error(err, str(k)) from None
        return out

    def split_by_device(self, metrics: PyTree) -> list[PyTree]:
        """See :func:`datarax.distributed.metrics.split_by_device`."""
        prepared = _lists_to_arrays(metrics)
        named, structure = self.flatten(prepared)
        _check_nonempty(named, metrics)
        n = self.device_count(named)
        if n is None:
            raise MetricsError(
                "empty_metrics",
                f"no metric has a device axis (received {metrics!r}); stack each metric as "
                "[n_devices, ...].",
            )
        leaves = [leaf for _, leaf in named]
        return [
            self.unflatten(
                structure, [x[i] if self.is_array(x) and x.ndim >= 1 else x for x in leaves]
            )
            for i in range(n)
        ]


_NUMPY = NumpyReducer()


# ------------------------------------------------------------------------ public API


def reduce_custom(
    metrics: Mapping[str, PyTree],
    reduce_fn: Mapping[str, ReduceOp | Callable[[Any], Any] | None] | None = None,
    *,
    weights: npt.ArrayLike | None = None,
    nan_policy: NanPolicy = "propagate",
) -> dict[str, Any]:
    """Reduces each top-level metric of NumPy arrays with its own operation.

    :func:`datarax.distributed.metrics.reduce_custom` for NumPy input, with the same
    answers and errors, in a module that imports no JAX.

    Args:
      metrics: mapping ``{name: [n_devices, ...] np.ndarray, list of numbers or subtree
        of dicts/lists/tuples}``.
      reduce_fn: ``{name: op}``; ``op`` is ``"mean"``, ``"sum"``, ``"max"``, ``"min"``, a
        callable applied to each stacked array leaf under that name, or ``None`` (the
        value is returned unreduced). Names not listed use ``"mean"``.
      weights: optional ``[n_devices]`` non-negative weights; they affect only ``"mean"``.
      nan_policy: ``"propagate"``, ``"omit"`` or ``"raise"``.

    Returns:
      ``dict`` with the same keys, each value reduced over its leading axis (NumPy arrays
      or ``np.generic`` scalars).

    Raises:
      MetricsError: the codes of :func:`datarax.distributed.metrics.reduce_custom`.
      TypeError: a ``jax.Array`` leaf or a container other than dict/list/tuple (use
        :mod:`datarax.distributed.metrics` for those).

    Example:
      >>> reduce_custom(
      ...     {"loss": np.array([1.0, 3.0]), "step": np.array([10, 10])},
      ...     reduce_fn={"loss": "mean", "step": "max"},
      ... )
      {'loss': np.float64(2.0), 'step': np.int64(10)}
    """
    return _NUMPY.reduce_custom(metrics, reduce_fn, weights, nan_policy)


def split_by_device(metrics: PyTree) -> list[PyTree]:
    """Splits stacked NumPy metrics into one tree per device.

    :func:`datarax.distributed.metrics.split_by_device` for NumPy input (what
    ``POST /v1/metrics/collect`` answers), in a module that imports no JAX.

    Args:
      metrics: tree of ``[n_devices, ...]`` NumPy arrays in dicts/lists/tuples (top-level
        lists of a mapping read as arrays).

    Returns:
      List of length ``n_devices``; entry ``i`` has the structure of ``metrics`` (dict
      keys sorted) with each stacked leaf replaced by ``leaf[i]``. Scalars and
      non-arrays repeat on every device.

    Raises:
      MetricsError: ``empty_metrics``, ``device_count_mismatch``, ``ragged_array``.
      TypeError: a ``jax.Array`` leaf or another container type.

    Example:
      >>> split_by_device({"loss": np.array([0.9, 1.1])})
      [{'loss': np.float64(0.9)}, {'loss': np.float64(1.1)}]
    """
    return _NUMPY.split_by_device(metrics)
