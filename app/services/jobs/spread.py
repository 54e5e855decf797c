"""The spread over devices of a pushed point's metrics (DESIGN, "Small additions a
scheduler and a dashboard need").

A mean hides a straggler or a diverging replica; the spread keeps, per metric that had
more than one device value, the smallest and largest value and the devices holding them:
``{"min", "max", "min_device", "max_device"}``, a device being its index along the pushed
device axis (for parts, along the merged one: the sources in order). Only finite values
count (NaN and infinities are what ``nan_policy`` and ``warnings`` are about); a metric
with none has no spread. A device holding several values (``[n_devices, ...]``) counts
its smallest for ``min`` and its largest for ``max``; ties go to the lowest device.
Metrics of one number per point, or of one device, have no spread; ``_weights`` is not
a metric.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from app.services.metric_inputs import WEIGHTS_ARRAY

type Spread = dict[str, dict[str, Any]]
"""metric -> {"min", "max", "min_device", "max_device"}"""

type SpreadArrays = dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
"""metric -> (has [P] bool, min [P], min_device [P], max [P], max_device [P])"""


def spread_columns(columns: Mapping[str, np.ndarray], points: int) -> SpreadArrays:
    """The spread of each of ``points`` points given as columns ``[P, n_devices, ...]``
    (columns of fewer dimensions, non-numeric ones and ``_weights`` are skipped), as
    columns: metric -> (has [P] bool, min, min_device, max, max_device)."""
    out: SpreadArrays = {}
    for name, array in columns.items():
        if name == WEIGHTS_ARRAY or array.ndim < 2 or array.shape[1] < 2:
            continue
        if array.dtype.kind not in "biuf" or array.shape[0] != points:
            continue
        values = array.reshape(points, array.shape[1], -1)
        if values.shape[2] == 0:
            continue
        values = values.astype(np.float64, copy=False)
        finite = np.isfinite(values)
        lows = np.where(finite, values, np.inf).min(axis=2)  # [P, D]
        highs = np.where(finite, values, -np.inf).max(axis=2)
        low_device = lows.argmin(axis=1)
        high_device = highs.argmax(axis=1)
        rows = np.arange(points)
        low = lows[rows, low_device]
        high = highs[rows, high_device]
        out[name] = (np.isfinite(low), low, low_device, high, high_device)
    return out


def spread_rows(columns: Mapping[str, np.ndarray], points: int) -> list[Spread | None]:
    """:func:`spread_columns` as one mapping (or None) per point."""
    return spread_dicts(spread_columns(columns, points), points)


def spread_dicts(arrays: SpreadArrays, points: int) -> list[Spread | None]:
    """Columns of :func:`spread_columns` as one mapping (or None) per point."""
    out: list[Spread | None] = [None] * points
    for name, (has_array, *values) in arrays.items():
        has = has_array.tolist()
        low, low_device, high, high_device = (v.tolist() for v in values)
        for i in range(points):
            if has[i]:
                entry = out[i]
                if entry is None:
                    entry = out[i] = {}
                entry[name] = {
                    "min": low[i],
                    "max": high[i],
                    "min_device": low_device[i],
                    "max_device": high_device[i],
                }
    return out


def point_spread(metrics: Mapping[str, Any]) -> Spread | None:
    """The spread of one point: ``metrics`` arrays ``[n_devices, ...]``."""
    arrays = {
        name: np.asarray(value)[None, ...]
        for name, value in metrics.items()
        if isinstance(value, np.ndarray) and value.ndim >= 1
    }
    return spread_rows(arrays, 1)[0] if arrays else None
