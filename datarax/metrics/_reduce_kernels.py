"""The JAX backend of :mod:`datarax.distributed.metrics`: the ``jnp`` reduction kernel,
its overflow checks, and :class:`JaxReducer`, which walks JAX pytrees and sends each leaf
to the JAX kernel (``jax.Array``, tracers) or to the NumPy one (NumPy leaves, through
:class:`~datarax.metrics.reductions.NumpyReducer`, which holds the checks and the
tree-level logic). Private: import the public names from ``datarax.distributed.metrics``;
the semantics (backends, dtypes, ``nan_policy``) are documented there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from datarax.errors import MetricsError
from datarax.metrics._exact_reductions import int_sum_exact, int_sum_may_overflow
from datarax.metrics._numpy_kernels import (
    integer_overflow,
    is_inexact,
    normalised,
    omit_reduce,
    omit_weighted_mean,
)
from datarax.metrics.reductions import (
    _ROOT,
    NumpyReducer,
    check_weight_shape,
    count_non_finite,
    flat_numpy_dict,
)
from datarax.tree_types import NamedLeaves, PyTree

__all__ = ["JAX_REDUCER", "JaxReducer"]


def _is_traced(x: object) -> bool:
    return isinstance(x, jax.core.Tracer)


def _is_none(x: object) -> bool:
    return x is None


def _mean_dtype(x: jax.Array) -> np.dtype[Any]:
    """Floating dtypes stay; integers and bools become JAX's default float."""
    if is_inexact(x.dtype):
        return x.dtype
    return jax.dtypes.canonicalize_dtype(np.float64)


def _jax_finite_where_possible(x: jax.Array, out: jax.Array, op: str) -> jax.Array:
    """A concrete JAX float sum or mean that overflowed where the true value is finite,
    recomputed on ``x * 2**-k`` (as ``scaled_sum``/``scaled_mean`` do for NumPy). Costs
    one check of the small result (a host read). Traced values keep XLA's plain
    reduction: a second, always-computed reduction would change every compiled step that
    reduces metrics (and its collectives); so do values this process cannot read whole."""
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


def _check_jax_int_sum(x: jax.Array) -> None:
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
        raise integer_overflow(x.shape, x.dtype, outside, acc)


def _reduce_jax(
    x: jax.Array, op: str, w: jax.typing.ArrayLike | None, nan_policy: str
) -> jax.Array:
    """Reduces the leading axis of one JAX array with ``ndim >= 1`` (inputs validated;
    ``w`` float64 NumPy weights, traced weights, or None)."""
    if x.dtype == np.bool_:
        x = x.astype(jax.dtypes.canonicalize_dtype(np.int64))  # bools count as JAX's int
    inexact = is_inexact(x.dtype)
    if op == "mean" and w is not None:
        dtype = _mean_dtype(x)
        wn = jnp.asarray(normalised(w)).astype(dtype).reshape((-1,) + (1,) * (x.ndim - 1))
        if x.dtype != dtype:
            x = x.astype(dtype)
        if nan_policy == "omit" and inexact:
            out: jax.Array = omit_weighted_mean(jnp, x, wn, dtype)
            return out
        # Multiply-then-sum (not a dot) stays valid on Explicit meshes too.
        return jnp.sum(wn * x, axis=0)
    if nan_policy != "omit" or not inexact:
        if op == "sum" and not inexact:
            _check_jax_int_sum(x)
        reductions: dict[str, Callable[..., jax.Array]] = {
            "mean": jnp.mean,
            "sum": jnp.sum,
            "max": jnp.max,
            "min": jnp.min,
        }
        plain = reductions[op](x, axis=0)
        if op in ("mean", "sum") and inexact:
            plain = _jax_finite_where_possible(x, plain, op)
        return plain
    omitted: jax.Array = omit_reduce(jnp, x, op)
    return omitted


class JaxReducer(NumpyReducer):
    """:class:`~datarax.metrics.reductions.NumpyReducer` over JAX pytrees whose
    leaves may be ``jax.Array``\\ s or tracers: those take the ``jnp`` kernel, NumPy
    leaves the NumPy one, so NumPy input answers exactly as the JAX-free module."""

    def is_array(self, x: object) -> bool:
        return isinstance(x, (np.ndarray, jax.Array))

    def flatten(self, tree: PyTree) -> tuple[NamedLeaves, object]:
        if flat_numpy_dict(tree):
            return super().flatten(tree)
        path_leaves, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_none)
        named = [
            (jax.tree_util.keystr(path, simple=True, separator="/") or _ROOT, leaf)
            for path, leaf in path_leaves
        ]
        return named, treedef

    def unflatten(self, structure: object, leaves: list[Any]) -> PyTree:
        if isinstance(structure, jax.tree_util.PyTreeDef):
            tree: PyTree = jax.tree_util.tree_unflatten(structure, leaves)
            return tree
        return super().unflatten(structure, leaves)

    def map_leaves(self, tree: PyTree, fn: Callable[[Any], Any]) -> PyTree:
        mapped: PyTree = jax.tree_util.tree_map(fn, tree, is_leaf=_is_none)
        return mapped

    def check_weights(self, weights: Any, n: int | None) -> Any:
        if _is_traced(weights):
            # Values are unknown under tracing; only the shape can be checked.
            check_weight_shape(weights.shape, n)
            return weights
        return super().check_weights(weights, n)

    def check_finite(self, name: str, x: Any) -> None:
        if not isinstance(x, jax.Array):
            return super().check_finite(name, x)
        if x.ndim == 0 or not is_inexact(x.dtype):
            return None
        if _is_traced(x):
            raise MetricsError(
                "nan_policy_traced",
                f"nan_policy='raise' cannot inspect traced values of metric {name!r} inside "
                "jit/pmap/shard_map; use nan_policy='propagate' or 'omit' there, or reduce "
                "outside the compiled function.",
            )
        count_non_finite(name, int(jnp.count_nonzero(~jnp.isfinite(x))), x.shape)
        return None

    def reduce_array(self, x: Any, op: str, w: Any, nan_policy: str) -> Any:
        use_jax = (type(x) is not np.ndarray and isinstance(x, jax.Array)) or (
            w is not None and op == "mean" and _is_traced(w)
        )
        if use_jax:
            return _reduce_jax(jnp.asarray(x), op, w, nan_policy)
        return super().reduce_array(x, op, w, nan_policy)


JAX_REDUCER = JaxReducer()
"""The reducer behind :mod:`datarax.distributed.metrics`."""
