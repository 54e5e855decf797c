"""Rollup rows: per level, metric and block, what a brute-force pass over the points gives;
the columnar form equal to the per-point one."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.storage.rollups import (
    FANOUT_BITS,
    LEVELS,
    columns_rollup_rows,
    rollup_rows,
    scalar_values,
)


def _brute_force(job, points):
    blocks: dict[tuple, list] = {}
    for step, values in sorted(points, key=lambda p: p[0]):
        for name, value in values.items():
            for level in LEVELS:
                key = (job, level, name, step >> (FANOUT_BITS * level))
                blocks.setdefault(key, []).append((step, value))
    rows = {}
    for key, entries in blocks.items():
        finite = [v for _, v in entries if math.isfinite(v)]
        last_step, last = entries[-1]
        rows[key] = (
            len(finite),
            sum(finite),
            min(finite) if finite else None,
            max(finite) if finite else None,
            last_step,
            last if math.isfinite(last) else None,
        )
    return rows


def test_rollup_rows_equal_a_brute_force_pass():
    rng = np.random.default_rng(5)
    steps = rng.choice(np.arange(70_000), size=800, replace=False)  # not in order
    values = rng.normal(size=steps.size)
    values[::37] = np.nan
    values[5] = np.inf
    points = [(int(s), {"loss": float(v), "lr": 0.5}) for s, v in zip(steps, values, strict=True)]
    got = {tuple(r[:4]): r[4:] for r in rollup_rows("j", points)}
    want = _brute_force("j", points)
    assert got.keys() == want.keys()
    for key, (n, total, low, high, last_step, last) in want.items():
        row = got[key]
        assert row[0] == n and row[1] == pytest.approx(total)
        assert (row[2], row[3], row[4], row[5]) == (low, high, last_step, last)


def test_points_with_different_metrics_roll_up_per_metric():
    points = [(0, {"a": 1.0}), (1, {"b": 2.0}), (2, {"a": 3.0, "b": 4.0})]
    got = {tuple(r[:4]): r[4:] for r in rollup_rows("j", points)}
    assert got == {tuple(k): v for k, v in _brute_force("j", points).items()}


def test_columns_roll_up_as_points_do():
    steps = [3, 4, 20, 300]
    values = {"loss": np.array([1.0, np.nan, 2.0, 5.0])}
    points = [(s, {"loss": float(v)}) for s, v in zip(steps, values["loss"], strict=True)]
    assert columns_rollup_rows("j", steps, values) == rollup_rows("j", points)


def test_scalar_values_read_null_as_nan_and_skip_arrays():
    got = scalar_values({"a": 1, "b": None, "c": [1, 2], "d": 2.5, "e": True})
    assert got["a"] == 1.0 and math.isnan(got["b"]) and got["d"] == 2.5
    assert "c" not in got and "e" not in got
