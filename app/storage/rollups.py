"""Rollups of job metrics: per scalar metric and block of ``16**level`` steps, the count,
sum, min and max of its finite values and its last value (table ``job_rollups``).

Levels 1-4 are blocks of 16, 256, 4,096 and 65,536 steps. A downsampled read
(:func:`app.storage.history.downsample`) aggregates these blocks instead of every point:
a 1,000-bucket read of a 1,000,000-step job reads ~4,000 rows per metric, not 1,000,000.
Rows are computed with numpy from whole columns (no loop per value) and added with one
``ON CONFLICT DO UPDATE`` statement each: SQLite's own atomicity, no read-modify-write.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from app.storage.store import ArrayInsert, Connection, Statement

FANOUT_BITS = 4
"""Rollup blocks grow 16x per level."""
LEVELS = (1, 2, 3, 4)


def scalar_values(reduced: dict[str, Any]) -> dict[str, float]:
    """The scalar numeric values of a reduced point (JSON null reads as NaN)."""
    out = {}
    for name, value in reduced.items():
        kind = type(value)
        if kind is float or kind is int:
            out[name] = float(value)
        elif value is None:
            out[name] = math.nan
    return out


def rollup_rows(job: str, points: Sequence[tuple[int, dict[str, float]]]) -> list[tuple]:
    """Per (level, metric, block): n, sum, min, max of the finite values, last step/value."""
    by_metric: dict[str, tuple[Any, Any]] = {}
    if not points:
        return []
    names = points[0][1].keys() if points else {}.keys()
    if all(values.keys() == names for _, values in points):
        # Every point has the same metrics (the usual batch): columns, no per-value loop.
        step_column = np.fromiter((step for step, _ in points), np.int64, len(points))
        for name in names:
            by_metric[name] = (
                step_column,
                np.fromiter((values[name] for _, values in points), np.float64, len(points)),
            )
    else:
        for step, values in points:
            for name, value in values.items():
                entry = by_metric.get(name)
                if entry is None:
                    entry = by_metric[name] = ([], [])
                entry[0].append(step)
                entry[1].append(value)
    shared: dict[int, np.ndarray] = {}
    return rollup_rows_of_columns(
        job,
        {
            name: (
                # one array for the metrics that share their steps (stacked together)
                shared.setdefault(id(step_list), np.asarray(step_list, dtype=np.int64)),
                np.asarray(value_list, dtype=np.float64),
            )
            for name, (step_list, value_list) in by_metric.items()
        },
    )


def rollup_rows_of_columns(
    job: str, columns: dict[str, tuple[np.ndarray, np.ndarray]]
) -> list[tuple]:
    """:func:`rollup_rows` of ``metric -> (steps [P] int64, values [P] float64)``: the
    blocks computed with numpy for every metric that shares one steps array at once, the
    rows built from whole columns (no loop per value)."""
    by_steps: dict[int, tuple[np.ndarray, list[str], list[np.ndarray]]] = {}
    for name, (steps, values) in columns.items():
        entry = by_steps.setdefault(id(steps), (steps, [], []))
        entry[1].append(name)
        entry[2].append(values)
    rows: list[tuple] = []
    for steps, names, value_list in by_steps.values():
        values = np.stack(value_list)  # [M, P]
        if steps.size > 1 and np.any(steps[1:] < steps[:-1]):
            order = np.argsort(steps, kind="stable")
            steps, values = steps[order], values[:, order]
        finite = np.isfinite(values)
        counts = finite.astype(np.int64)
        kept = np.where(finite, values, 0.0)
        lows = np.where(finite, values, np.inf)
        highs = np.where(finite, values, -np.inf)
        for level in LEVELS:
            blocks = steps >> (FANOUT_BITS * level)
            change = np.empty(steps.size, dtype=bool)
            change[0] = True
            np.not_equal(blocks[1:], blocks[:-1], out=change[1:])
            starts = np.flatnonzero(change)
            ends = np.append(starts[1:], steps.size) - 1
            n = np.add.reduceat(counts, starts, axis=1)
            total = np.add.reduceat(kept, starts, axis=1).tolist()
            low = np.where(n > 0, np.minimum.reduceat(lows, starts, axis=1), np.nan).tolist()
            high = np.where(n > 0, np.maximum.reduceat(highs, starts, axis=1), np.nan).tolist()
            last = values[:, ends]
            last = np.where(np.isfinite(last), last, np.nan).tolist()
            n = n.tolist()
            block_ids = blocks[starts].tolist()
            last_steps = steps[ends].tolist()
            count = len(block_ids)
            for m, name in enumerate(names):
                rows += zip(
                    itertools.repeat(job, count),
                    itertools.repeat(level, count),
                    itertools.repeat(name, count),
                    block_ids,
                    n[m],
                    total[m],
                    [None if v != v else v for v in low[m]],  # no finite value: NULL
                    [None if v != v else v for v in high[m]],
                    last_steps,
                    [None if v != v else v for v in last[m]],  # NaN or inf: NULL
                    strict=True,
                )
    return rows


ROLLUP_UPSERT = Statement(
    "INSERT INTO job_rollups (job, level, metric, block, n, total, low, high, last_step, "
    "last) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (job, level, metric, block) DO UPDATE SET "
    "n = job_rollups.n + excluded.n, total = job_rollups.total + excluded.total, "
    "low = coalesce(min(job_rollups.low, excluded.low), job_rollups.low, excluded.low), "
    "high = coalesce(max(job_rollups.high, excluded.high), job_rollups.high, excluded.high), "
    "last = CASE WHEN excluded.last_step > job_rollups.last_step THEN excluded.last "
    "ELSE job_rollups.last END, "
    "last_step = max(job_rollups.last_step, excluded.last_step)",
    "INSERT INTO job_rollups (job, level, metric, block, n, total, low, high, "
    "last_step, last) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT "
    "(job, level, metric, block) DO UPDATE SET n = job_rollups.n + excluded.n, "
    "total = job_rollups.total + excluded.total, low = "
    "coalesce(least(job_rollups.low, excluded.low), job_rollups.low, excluded.low), "
    "high = coalesce(greatest(job_rollups.high, excluded.high), job_rollups.high, "
    "excluded.high), last = CASE WHEN excluded.last_step > job_rollups.last_step "
    "THEN excluded.last ELSE job_rollups.last END, last_step = "
    "greatest(job_rollups.last_step, excluded.last_step)",
    ArrayInsert(
        "INSERT INTO job_rollups (job, level, metric, block, n, total, low, high, "
        "last_step, last) SELECT u.c0, u.c1, u.c2, u.c3, u.c4, u.c5, u.c6, u.c7, u.c8, "
        "u.c9 FROM unnest(%b::text[], %b::bigint[], %b::text[], %b::bigint[], "
        "%b::bigint[], %b::double precision[], %b::double precision[], %b::double "
        "precision[], %b::bigint[], %b::double precision[]) AS u(c0, c1, c2, c3, c4, "
        "c5, c6, c7, c8, c9) ON CONFLICT (job, level, metric, block) DO UPDATE SET n = "
        "job_rollups.n + excluded.n, total = job_rollups.total + excluded.total, low = "
        "coalesce(least(job_rollups.low, excluded.low), job_rollups.low, excluded.low), "
        "high = coalesce(greatest(job_rollups.high, excluded.high), job_rollups.high, "
        "excluded.high), last = CASE WHEN excluded.last_step > job_rollups.last_step "
        "THEN excluded.last ELSE job_rollups.last END, last_step = "
        "greatest(job_rollups.last_step, excluded.last_step)",
        (
            "text",
            "bigint",
            "text",
            "bigint",
            "bigint",
            "double precision",
            "double precision",
            "double precision",
            "bigint",
            "double precision",
        ),
        (0, 1, 2, 3),
    ),
)
"""Adds a block's aggregate to what the block holds, in one statement."""


def write_rollups(
    conn: Connection, job: str, points: Sequence[tuple[int, dict[str, float]]]
) -> None:
    """Adds points to their blocks, merging with what the blocks hold, in one statement
    per row (``ON CONFLICT DO UPDATE``: SQLite's own atomicity, no read-modify-write)."""
    if not points:
        return
    conn.executemany(ROLLUP_UPSERT, rollup_rows(job, points))


def columns_rollup_rows(
    job: str, steps: Sequence[int], values: Mapping[str, np.ndarray]
) -> list[tuple]:
    """The rollup rows of complete steps given as columns (``metric -> [P]`` float64):
    :data:`ROLLUP_UPSERT` parameters, to compute before a write so that the store's lock
    is held for SQLite's work only."""
    step_array = np.asarray(steps, dtype=np.int64)
    return rollup_rows_of_columns(job, {k: (step_array, v) for k, v in values.items()})
