"""Reductions of stacked per-device metrics.

A *stacked* metric has the device axis first: ``loss: [n_devices]`` reduces to a
scalar, ``per_class: [n_devices, k]`` to ``[k]``. Two families:

* SPMD reductions (:func:`reduce_mean`, :func:`reduce_sum`, :func:`reduce_max`,
  :func:`reduce_min`, :func:`reduce_custom`, :func:`reduce_over_devices`) take global
  arrays. They work eagerly and inside ``jax.jit``/``nnx.jit`` under ``jax.set_mesh``,
  where a device axis sharded over ``'data'`` makes XLA insert the all-reduce.
* Collective reductions (:func:`reduce_mean_collective`, :func:`reduce_sum_collective`,
  :func:`all_gather`) call ``lax.pmean``/``psum``/``all_gather`` and are only valid
  inside ``jax.pmap`` or ``jax.shard_map`` with a matching ``axis_name``; they live in
  :mod:`datarax.spmd.collectives` and are re-exported here.

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

Numbers never wrap (see :mod:`datarax.metrics._exact_reductions`):

- Integer sums are exact or refused: a sum whose exact value does not fit the result
  dtype (``int64``/``uint64`` for NumPy, JAX's default int without x64) is a
  :class:`MetricsError` ``integer_overflow``, never the wrapped value (``[2**63 - 1, 1]``
  is not ``-2**63``). Checked by bounds first (the dtype alone for small integers, one
  max/min pass for 64-bit ones), exactly only when the bounds cannot rule it out. The
  mean of integers is computed from the exact sum (within one ulp of the exact mean);
  ``max``/``min`` are exact anyway; a weighted mean converts the values to float64.
  Traced integer sums (inside ``jit``) cannot be inspected and keep JAX's modular
  arithmetic, as do JAX arrays this process cannot read whole.
- Float sums and means are finite wherever the true result is: where the plain result is
  not finite, it is recomputed on values scaled by ``2**-k`` (``2**k >= n_devices``), so
  the mean of ``[1e308, 1e308]`` is ``1e308``; NaN and inf inputs still propagate (NumPy,
  and concrete JAX arrays; traced ones keep XLA's plain reduction).
- Weighted means are scale-invariant: weights are divided by their maximum, then by their
  sum, so ``[1e308, 1e308]`` weighs like ``[1, 1]``.

``nan_policy``: ``"propagate"`` (plain arithmetic; NumPy floating-point warnings are
silenced, non-finite results show in the values), ``"omit"`` (NaN and ±inf entries are
dropped per position, together with their weights; a position with nothing finite gives
NaN), ``"raise"`` (any non-finite entry is a :class:`MetricsError`; not possible on traced
floating values, see :class:`MetricsError` code ``nan_policy_traced``).

An empty tree (no leaves at all) is ``empty_metrics``, so a service can turn it into a 422.

Per-device views: :func:`collect_from_devices` (upstream datarax's shape: a dict whose
stacked values become per-device lists) and :func:`split_by_device` (one pytree per
device, what ``POST /v1/metrics/collect`` answers).

A process that reduces only NumPy arrays (the service's HTTP process) imports
:func:`~datarax.metrics.reductions.reduce_custom` and
:func:`~datarax.metrics.reductions.split_by_device` from
:mod:`datarax.metrics.reductions` instead: the same answers for NumPy input, without
importing JAX. Both run one implementation (the JAX backend here hands NumPy leaves to it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from datarax.errors import MetricsError, UnboundAxisError
from datarax.metrics._reduce_kernels import JAX_REDUCER
from datarax.metrics.reductions import (
    NAN_POLICIES,
    REDUCE_OPS,
    check_nan_policy,
    check_op,
    list_to_array,
)
from datarax.spmd.collectives import (
    all_gather,
    reduce_mean_collective,
    reduce_sum_collective,
)
from datarax.tree_types import NanPolicy, PyTree, ReduceOp

__all__ = [
    "NAN_POLICIES",
    "REDUCE_OPS",
    "MetricsError",
    "UnboundAxisError",
    "all_gather",
    "collect_from_devices",
    "reduce_custom",
    "reduce_max",
    "reduce_mean",
    "reduce_mean_collective",
    "reduce_min",
    "reduce_over_devices",
    "reduce_sum",
    "reduce_sum_collective",
    "split_by_device",
]

# --------------------------------------------------------------------- public API


def reduce_over_devices(
    values: jax.typing.ArrayLike | list[Any],
    op: ReduceOp = "mean",
    *,
    weights: jax.typing.ArrayLike | None = None,
    nan_policy: NanPolicy = "propagate",
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
        ``integer_overflow`` (an integer sum that does not fit its dtype),
        ``invalid_weights`` (also weights with an op other than mean),
        ``weights_mismatch``, ``empty_metrics`` (0 devices), ``ragged_array``,
        ``non_finite_values``, ``nan_policy_traced``.

    Example:
      >>> reduce_over_devices(np.array([[1.0, 2.0], [3.0, 4.0]]), "max")
      array([3., 4.])
    """
    check_nan_policy(nan_policy)
    check_op(op)
    if weights is not None and op != "mean":
        raise MetricsError(
            "invalid_weights",
            f"weights apply only to op='mean', got op={op!r}; drop the weights or use mean.",
        )
    values = list_to_array("values", values)
    if not isinstance(values, (np.ndarray, jax.Array)) or values.ndim == 0:
        return values
    w = JAX_REDUCER.check_weights(weights, JAX_REDUCER.device_count([("values", values)]))
    if nan_policy == "raise":
        JAX_REDUCER.check_finite("values", values)
    return JAX_REDUCER.reduce_array(values, op, w, nan_policy)


def reduce_mean(
    metrics: PyTree,
    *,
    weights: jax.typing.ArrayLike | None = None,
    nan_policy: NanPolicy = "propagate",
) -> PyTree:
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
    prepared, w = JAX_REDUCER.validate(metrics, weights, nan_policy)
    return JAX_REDUCER.apply(prepared, "mean", w, nan_policy)


def reduce_sum(metrics: PyTree, *, nan_policy: NanPolicy = "propagate") -> PyTree:
    """Sum over the device axis of every stacked metric; see :func:`reduce_mean`.

    Args:
      metrics: pytree of ``[n_devices, ...]`` arrays.
      nan_policy: ``"propagate"``, ``"omit"`` or ``"raise"``.

    Returns:
      The same structure with each leaf reduced to ``[...]``; integers stay integers.

    Raises:
      MetricsError: as :func:`reduce_mean`, without the weights codes; and
        ``integer_overflow`` for an integer sum whose exact value does not fit its dtype.
    """
    prepared, w = JAX_REDUCER.validate(metrics, None, nan_policy)
    return JAX_REDUCER.apply(prepared, "sum", w, nan_policy)


def reduce_max(metrics: PyTree, *, nan_policy: NanPolicy = "propagate") -> PyTree:
    """Maximum over the device axis of every stacked metric; see :func:`reduce_sum`."""
    prepared, w = JAX_REDUCER.validate(metrics, None, nan_policy)
    return JAX_REDUCER.apply(prepared, "max", w, nan_policy)


def reduce_min(metrics: PyTree, *, nan_policy: NanPolicy = "propagate") -> PyTree:
    """Minimum over the device axis of every stacked metric; see :func:`reduce_sum`."""
    prepared, w = JAX_REDUCER.validate(metrics, None, nan_policy)
    return JAX_REDUCER.apply(prepared, "min", w, nan_policy)


def reduce_custom(
    metrics: Mapping[str, Any],
    reduce_fn: Mapping[str, ReduceOp | Callable[[Any], Any] | None] | None = None,
    *,
    weights: jax.typing.ArrayLike | None = None,
    nan_policy: NanPolicy = "propagate",
) -> dict[str, Any]:
    """Reduces each top-level metric with its own operation.

    Args:
      metrics: mapping ``{name: [n_devices, ...] array or subtree}``.
      reduce_fn: ``{name: op}``; ``op`` is ``"mean"``, ``"sum"``, ``"max"``, ``"min"`` or
        a callable applied to each stacked ``[n_devices, ...]`` array leaf under that name
        (the callable owns its NaN handling and ignores weights; ``nan_policy="raise"``
        still checks its input), or ``None``: the value is returned unreduced, as in
        upstream datarax. Names not listed use ``"mean"``.
      weights: optional ``[n_devices]`` weights; they affect only ``"mean"`` metrics,
        ``sum``/``max``/``min`` ignore them.
      nan_policy: ``"propagate"``, ``"omit"`` or ``"raise"``.

    Returns:
      ``dict`` with the same keys, each value reduced over its leading axis.

    Raises:
      MetricsError: ``unknown_reduce_op`` (an op string not in ``REDUCE_OPS``),
        ``unknown_metric`` (a ``reduce_fn`` name missing from ``metrics``),
        ``integer_overflow`` (a ``"sum"`` metric; the message names it), plus the codes
        of :func:`reduce_mean`.

    Example:
      >>> reduce_custom(
      ...     {"loss": np.array([1.0, 3.0]), "step": np.array([10, 10])},
      ...     reduce_fn={"loss": "mean", "step": "max"},
      ... )
      {'loss': np.float64(2.0), 'step': np.int64(10)}
    """
    return JAX_REDUCER.reduce_custom(metrics, reduce_fn, weights, nan_policy)


def collect_from_devices(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Splits each stacked metric into a per-device list (upstream datarax's semantics).

    Call it outside the mapped function, on what ``pmap`` or a sharded step returned.

    Args:
      metrics: mapping ``{name: value}``; a value that is an array (``jax.Array`` or
        ``np.ndarray``) with ``ndim >= 1`` has the device axis first, ``[n_devices, ...]``.

    Returns:
      A ``dict`` with the same keys: each such array becomes a list of its
      ``n_devices`` rows (``[...]`` each; NumPy rows for NumPy input, ``jax.Array`` rows
      for JAX input); scalars, 0-d arrays and other values (lists, strings, nested
      dicts) are returned unchanged. Metrics need not agree on ``n_devices``, and a
      mapping without any stacked value comes back as it is (as a ``dict``).

    Raises:
      TypeError: ``metrics`` is not a mapping (the message names the type received).

    Example:
      >>> out = collect_from_devices({"loss": np.array([0.9, 1.1]), "lr": 0.1})
      >>> out["loss"][1], out["lr"]
      (np.float64(1.1), 0.1)
    """
    if not isinstance(metrics, Mapping):
        raise TypeError(
            f"collect_from_devices takes a mapping of metric names to stacked arrays, got "
            f"{type(metrics).__name__}; pass e.g. {{'loss': losses}} with losses "
            "[n_devices], or use split_by_device for any pytree."
        )
    return {
        name: list(value) if JAX_REDUCER.is_array(value) and value.ndim >= 1 else value
        for name, value in metrics.items()
    }


def split_by_device(metrics: PyTree) -> list[PyTree]:
    """Splits stacked metrics into one pytree per device.

    What ``POST /v1/metrics/collect`` answers (and what ``collect_from_devices`` returned
    before it took upstream's shape).

    Args:
      metrics: pytree of ``[n_devices, ...]`` arrays (top-level lists of a mapping read as
        NumPy arrays, as in the module doc).

    Returns:
      List of length ``n_devices``; entry ``i`` has the structure of ``metrics`` with
      each stacked leaf replaced by ``leaf[i]`` (``[...]``; NumPy in gives NumPy, JAX
      in gives JAX). Scalars and non-arrays repeat on every device.

    Raises:
      MetricsError: ``empty_metrics`` (no leaves, or no leaf with a device axis),
        ``device_count_mismatch``, ``ragged_array``.

    Example:
      >>> split_by_device({"loss": np.array([0.9, 1.1])})
      [{'loss': np.float64(0.9)}, {'loss': np.float64(1.1)}]
    """
    return JAX_REDUCER.split_by_device(metrics)
