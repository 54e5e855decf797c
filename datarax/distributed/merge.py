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

from datarax.distributed._reduce_kernels import MetricsError
from datarax.distributed.metrics import reduce_custom
from datarax.distributed.typing import NanPolicy, ReduceOp


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


__all__ = ["PartialMetrics", "merge_parts"]
