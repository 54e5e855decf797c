"""Merging partial stacked metrics: each host holds the metrics of its own devices only.

A multi-host job sees, on each process, ``loss: [n_local_devices]``. To reduce over every
device of the job without an all-gather on the training path, keep each host's part as a
:class:`PartialMetrics` and merge the parts later (in the job, or in the service that
stores the job's history, which calls the same function). Merging concatenates the device
axes in the order given, so reducing a merged part is *exactly* reducing one array that
held every device: a mean is the mean over all devices (weighted per device where
``weights`` are given), never a mean of means; ``sum``, ``max`` and ``min`` and every
``nan_policy`` apply over all devices alike. (CLU's ``Metric.merge`` merges running
totals inside one job; here the parts stay stacked, so the merge is exact for every op
and NaN policy, at the price of keeping ``n_devices`` values per metric.)

Example:
  >>> host0 = PartialMetrics({"loss": np.array([1.0, 3.0])}, weights=np.array([1.0, 1.0]))
  >>> host1 = PartialMetrics({"loss": np.array([5.0])}, weights=np.array([2.0]))
  >>> host0.merge(host1).reduce()
  {'loss': np.float64(3.5)}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from datarax.errors import MetricsError
from datarax.metrics.reductions import reduce_custom
from datarax.tree_types import NanPolicy, ReduceOp


def _as_array(name: str, value: Any) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype.kind not in "biuf":
        raise MetricsError(
            "invalid_tensor",
            f"metric {name!r} has dtype {array.dtype}; metrics must be real numbers",
        )
    return array


@dataclass(frozen=True)
class PartialMetrics:
    """The stacked metrics of some devices of a job: one host's (or one source's) part.

    Attributes:
      metrics: name -> ``[n_devices, ...]`` array of this part's devices; a 0-d value
        (``"lr": 0.001``) is one every device agrees on and is not reduced.
      weights: optional ``[n_devices]`` weights of this part's devices (``mean`` only).
    """

    metrics: Mapping[str, np.ndarray]
    weights: np.ndarray | None = field(default=None)

    def __post_init__(self) -> None:
        if not self.metrics:
            raise MetricsError("empty_metrics", "a part needs at least one metric")
        arrays = {str(k): _as_array(str(k), v) for k, v in self.metrics.items()}
        object.__setattr__(self, "metrics", arrays)
        if self.weights is not None:
            object.__setattr__(self, "weights", np.asarray(self.weights, dtype=np.float64))

    @property
    def num_devices(self) -> int:
        """The device count of this part (0 when every metric is a 0-d value)."""
        for value in self.metrics.values():
            if value.ndim:
                return int(value.shape[0])
        return 0

    def merge(self, other: PartialMetrics) -> PartialMetrics:
        """This part followed by ``other`` on the device axis (see :func:`merge_parts`)."""
        return merge_parts([self, other])

    def reduce(
        self,
        reduce_fn: Mapping[str, ReduceOp] | None = None,
        *,
        nan_policy: NanPolicy = "propagate",
    ) -> dict[str, Any]:
        """``reduce_custom`` over this part's devices (0-d values pass through)."""
        return reduce_custom(
            dict(self.metrics), reduce_fn, weights=self.weights, nan_policy=nan_policy
        )


def _signature(part: PartialMetrics) -> dict[str, tuple[int, ...] | None]:
    # None marks a 0-d value; arrays are known by their per-device shape.
    return {k: (None if v.ndim == 0 else tuple(v.shape[1:])) for k, v in part.metrics.items()}


def merge_parts(parts: Sequence[PartialMetrics]) -> PartialMetrics:
    """Concatenates parts on the device axis, in the order given.

    Args:
      parts: one or more parts with the same metric names and per-device shapes. A 0-d
        value must be equal (NaN equal to NaN) in every part. Weights are kept per
        device; a part without weights counts each of its devices with weight 1 when
        another part has weights.

    Returns:
      One part: ``metrics[name]`` is ``[sum of n_devices, ...]``.

    Raises:
      MetricsError: ``empty_metrics`` (no parts), ``part_mismatch`` (metric names,
        per-device shapes or a 0-d value differ between parts, naming the first
        difference), and ``device_count_mismatch`` (a part whose metrics disagree on
        the device count).

    Example:
      >>> merged = merge_parts([PartialMetrics({"x": np.ones((2, 3))}),
      ...                       PartialMetrics({"x": np.zeros((1, 3))})])
      >>> merged.metrics["x"].shape
      (3, 3)
    """
    if not parts:
        raise MetricsError("empty_metrics", "merge_parts needs at least one part")
    first = _signature(parts[0])
    for index, part in enumerate(parts):
        sizes = {v.shape[0] for v in part.metrics.values() if v.ndim}
        if len(sizes) > 1:
            raise MetricsError(
                "device_count_mismatch",
                f"part {index} has metrics with different device counts {sorted(sizes)}",
            )
        signature = _signature(part)
        if signature != first:
            names = sorted(set(signature) ^ set(first))
            what = (
                f"metric names differ ({names})"
                if names
                else "per-device shapes differ: "
                + ", ".join(
                    f"{k}: {first[k]} vs {signature[k]}" for k in first if first[k] != signature[k]
                )
            )
            raise MetricsError(
                "part_mismatch",
                f"part {index} does not match part 0: {what}; every part must send the "
                "same metrics with the same per-device shape",
            )
    if len(parts) == 1:
        return parts[0]
    merged: dict[str, np.ndarray] = {}
    for name, shape in first.items():
        values = [part.metrics[name] for part in parts]
        if shape is None:
            if not all(np.array_equal(values[0], v, equal_nan=True) for v in values[1:]):
                raise MetricsError(
                    "part_mismatch",
                    f"metric {name!r} is a value every device agrees on, but the parts send "
                    f"{[v.item() for v in values]}",
                )
            merged[name] = values[0]
        else:
            merged[name] = np.concatenate(values, axis=0)
    weights = None
    if any(part.weights is not None for part in parts):
        weights = np.concatenate(
            [
                part.weights if part.weights is not None else np.ones(part.num_devices)
                for part in parts
            ]
        )
    return PartialMetrics(merged, weights=weights)


@dataclass(frozen=True)
class MergedSteps:
    """Several steps merged at once (:func:`merge_steps`).

    Attributes:
      count: how many steps.
      num_devices: devices of each merged step, every part's together (0 when every
        metric is a 0-d value).
      columns: name -> ``[count]`` float64 reduced values, when the steps took the
        stacked path (every value one number); else None.
      reduced: otherwise, per step, the reduced values as :func:`reduce_custom` gives them.
    """

    count: int
    num_devices: int
    columns: dict[str, NDArray[np.float64]] | None = None
    reduced: list[dict[str, Any]] = field(default_factory=list)


def _stackable(parts: Sequence[Mapping[str, np.ndarray]], nan_policy: str) -> bool:
    """Unweighted float64 ``[k, n_devices]`` metrics with NaN policy ``propagate``: one
    stacked reduction over the concatenated devices gives every step's values."""
    return nan_policy == "propagate" and all(
        a.dtype == np.float64 and a.ndim == 2 for arrays in parts for a in arrays.values()
    )


def merge_steps(
    parts: Sequence[Mapping[str, np.ndarray]],
    reduce_fn: Mapping[str, ReduceOp],
    *,
    weights: Sequence[np.ndarray | None] | None = None,
    nan_policy: NanPolicy = "propagate",
) -> MergedSteps:
    """Merges and reduces the parts of ``k`` steps, each exactly as one push of every device.

    A pure function of its arrays (what a store of multi-host history calls when steps
    complete). Unweighted float64 ``[k, n_devices]`` metrics with ``propagate`` are
    concatenated along the device axis and reduced in one stacked call; anything else
    step by step through :func:`merge_parts` and :meth:`PartialMetrics.reduce`. Both give
    the values one push of every device would.

    Args:
      parts: per source, in the order to concatenate: name -> ``[k, n_devices, ...]``
        (``[k]``: a value every device agrees on). Every part names the same metrics.
      reduce_fn: name -> operation; unlisted metrics use ``mean``.
      weights: per part, ``[k, n_devices]`` weights or None (``mean`` only).
      nan_policy: as for :func:`reduce_custom`.

    Returns:
      The merged steps: :attr:`MergedSteps.columns` on the stacked path, else
      :attr:`MergedSteps.reduced`.

    Raises:
      MetricsError: the library's codes (``part_mismatch``, ``invalid_weights``, ...).
    """
    if not parts:
        raise MetricsError("empty_metrics", "merge_steps needs at least one part")
    names = list(parts[0])
    count = int(parts[0][names[0]].shape[0]) if names else 0
    given = list(weights) if weights is not None else [None] * len(parts)
    if count and all(w is None for w in given) and _stackable(parts, nan_policy):
        joined = {n: np.concatenate([arrays[n] for arrays in parts], axis=1) for n in names}
        ops: dict[str, ReduceOp] = {n: reduce_fn.get(n, "mean") for n in names}
        reduced = reduce_custom({n: v.T for n, v in joined.items()}, dict(ops))
        columns = {n: np.asarray(reduced[n], dtype=np.float64) for n in names}
        return MergedSteps(count, int(joined[names[0]].shape[1]), columns=columns)
    steps: list[dict[str, Any]] = []
    devices = 0
    for j in range(count):
        loaded = [
            PartialMetrics(
                {n: a[j] for n, a in arrays.items()}, weights=None if w is None else w[j]
            )
            for arrays, w in zip(parts, given, strict=True)
        ]
        merged = merge_parts(loaded)
        steps.append(merged.reduce(reduce_fn, nan_policy=nan_policy))
        devices = merged.num_devices
    return MergedSteps(count, devices, reduced=steps)


__all__ = ["MergedSteps", "PartialMetrics", "merge_parts", "merge_steps"]
