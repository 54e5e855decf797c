"""The spread over devices of stored job points, and its extremes per block of steps.

- ``job_spreads (job, step, spread)``: a complete step's spread
  (``{metric: {"min", "max", "min_device", "max_device"}}``, :mod:`app.services.jobs.spread`),
  for the steps that have one (a step of one device, or of one number per metric, has
  none), stored compactly (:func:`encode_rows`: the names, then 32 bytes a metric) and
  turned into JSON when read: a push stores thousands of steps, a read shows a page.
- ``job_spread_blocks``: per metric and block of ``16**level`` steps (the blocks of
  :mod:`app.storage.rollups`), the smallest ``min`` and the largest ``max`` of the block's
  spreads, each with its device and step. A downsampled read takes a bucket's extremes
  from these blocks as it takes its means from the rollups. Blocks are merged with one
  ``ON CONFLICT DO UPDATE`` statement each (the ``SET`` expressions read the row as it was,
  so a device changes exactly when its value does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from app.storage.rollups import FANOUT_BITS, LEVELS
from app.storage.store import ArrayInsert, Connection, Statement

type SpreadOf = tuple[int, dict[str, dict[str, Any]]]
"""(step, spread) of a stored step."""

SPREAD_UPSERT = Statement(
    "INSERT INTO job_spread_blocks AS b (job, level, metric, block, low, low_device, low_step, "
    "high, high_device, high_step) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (job, level, metric, block) DO UPDATE SET "
    "low_device = CASE WHEN excluded.low < b.low THEN excluded.low_device "
    "ELSE b.low_device END, "
    "low_step = CASE WHEN excluded.low < b.low THEN excluded.low_step ELSE b.low_step END, "
    "low = min(b.low, excluded.low), "
    "high_device = CASE WHEN excluded.high > b.high THEN excluded.high_device "
    "ELSE b.high_device END, "
    "high_step = CASE WHEN excluded.high > b.high THEN excluded.high_step "
    "ELSE b.high_step END, "
    "high = max(b.high, excluded.high)",
    "INSERT INTO job_spread_blocks AS b (job, level, metric, block, low, "
    "low_device, low_step, high, high_device, high_step) VALUES (%s, %s, %s, %s, "
    "%s, %s, %s, %s, %s, %s) ON CONFLICT (job, level, metric, block) DO UPDATE SET "
    "low_device = CASE WHEN excluded.low < b.low THEN excluded.low_device ELSE "
    "b.low_device END, low_step = CASE WHEN excluded.low < b.low THEN "
    "excluded.low_step ELSE b.low_step END, low = least(b.low, excluded.low), "
    "high_device = CASE WHEN excluded.high > b.high THEN excluded.high_device ELSE "
    "b.high_device END, high_step = CASE WHEN excluded.high > b.high THEN "
    "excluded.high_step ELSE b.high_step END, high = greatest(b.high, "
    "excluded.high)",
    ArrayInsert(
        "INSERT INTO job_spread_blocks AS b (job, level, metric, block, low, "
        "low_device, low_step, high, high_device, high_step) SELECT u.c0, u.c1, u.c2, "
        "u.c3, u.c4, u.c5, u.c6, u.c7, u.c8, u.c9 FROM unnest(%b::text[], %b::bigint[], "
        "%b::text[], %b::bigint[], %b::double precision[], %b::bigint[], %b::bigint[], "
        "%b::double precision[], %b::bigint[], %b::bigint[]) AS u(c0, c1, c2, c3, c4, "
        "c5, c6, c7, c8, c9) ON CONFLICT (job, level, metric, block) DO UPDATE SET "
        "low_device = CASE WHEN excluded.low < b.low THEN excluded.low_device ELSE "
        "b.low_device END, low_step = CASE WHEN excluded.low < b.low THEN "
        "excluded.low_step ELSE b.low_step END, low = least(b.low, excluded.low), "
        "high_device = CASE WHEN excluded.high > b.high THEN excluded.high_device ELSE "
        "b.high_device END, high_step = CASE WHEN excluded.high > b.high THEN "
        "excluded.high_step ELSE b.high_step END, high = greatest(b.high, "
        "excluded.high)",
        (
            "text",
            "bigint",
            "text",
            "bigint",
            "double precision",
            "bigint",
            "bigint",
            "double precision",
            "bigint",
            "bigint",
        ),
        (0, 1, 2, 3),
    ),
)


def _extremes(blocks: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Index of the smallest value of each run of equal ``blocks`` (the first such in
    step order on ties); ``blocks`` ascending. No sort: a block's minimum, then the first
    position holding it."""
    starts = np.flatnonzero(np.r_[True, blocks[1:] != blocks[:-1]])
    smallest = np.minimum.reduceat(values, starts)
    run = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, blocks.size]))
    holding = np.flatnonzero(values == smallest[run])
    first = np.r_[True, run[holding][1:] != run[holding][:-1]]
    return holding[first]


type SpreadColumn = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""(has [P] bool, min [P], min_device [P], max [P], max_device [P]) of one metric."""


def _block_rows(
    job: str,
    name: str,
    steps: np.ndarray,
    low: np.ndarray,
    low_device: np.ndarray,
    high: np.ndarray,
    high_device: np.ndarray,
) -> list[tuple]:
    """:data:`SPREAD_UPSERT` parameters of one metric's blocks, every level."""
    if steps.size > 1 and np.any(steps[1:] < steps[:-1]):
        order = np.argsort(steps, kind="stable")
        steps, low, low_device = steps[order], low[order], low_device[order]
        high, high_device = high[order], high_device[order]
    rows: list[tuple] = []
    for level in LEVELS:
        blocks = steps >> (FANOUT_BITS * level)
        lows = _extremes(blocks, low)
        highs = _extremes(blocks, -high)
        count = lows.size
        rows += zip(
            [job] * count,
            [level] * count,
            [name] * count,
            blocks[lows].tolist(),
            low[lows].tolist(),
            low_device[lows].tolist(),
            steps[lows].tolist(),
            high[highs].tolist(),
            high_device[highs].tolist(),
            steps[highs].tolist(),
            strict=True,
        )
    return rows


def spread_block_rows(job: str, spreads: Sequence[SpreadOf]) -> list[tuple]:
    """:data:`SPREAD_UPSERT` parameters of the blocks ``spreads`` fall in."""
    by_metric: dict[str, list[list[Any]]] = {}
    for step, spread in spreads:
        for name, entry in spread.items():
            columns = by_metric.setdefault(name, [[], [], [], [], []])
            columns[0].append(step)
            columns[1].append(entry["min"])
            columns[2].append(entry["min_device"])
            columns[3].append(entry["max"])
            columns[4].append(entry["max_device"])
    rows: list[tuple] = []
    for name, columns in by_metric.items():
        rows += _block_rows(
            job,
            name,
            np.asarray(columns[0], dtype=np.int64),
            np.asarray(columns[1], dtype=np.float64),
            np.asarray(columns[2], dtype=np.int64),
            np.asarray(columns[3], dtype=np.float64),
            np.asarray(columns[4], dtype=np.int64),
        )
    return rows


ROW = np.dtype([("min", "<f8"), ("max", "<f8"), ("min_device", "<i8"), ("max_device", "<i8")])
"""One metric's spread in a stored row (a metric a step has no spread of: NaN min)."""


def encode_rows(columns: dict[str, SpreadColumn], points: int) -> list[bytes | None]:
    """Each step's stored spread: the metric names as a JSON list and a newline, then one
    :data:`ROW` per metric (no mapping or JSON text per step: a push stores thousands);
    None for a step without any."""
    names = list(columns)
    if not names:
        return [None] * points
    table = np.empty((points, len(names)), dtype=ROW)
    any_spread = np.zeros(points, dtype=bool)
    for m, name in enumerate(names):
        has, low, low_device, high, high_device = columns[name]
        table["min"][:, m] = np.where(has, low, np.nan)
        table["max"][:, m] = high
        table["min_device"][:, m] = low_device
        table["max_device"][:, m] = high_device
        any_spread |= has
    head = orjson.dumps(names) + b"\n"
    data = table.tobytes()
    width = len(names) * ROW.itemsize
    return [
        head + data[i * width : (i + 1) * width] if any_spread[i] else None for i in range(points)
    ]


def decode_row(stored: bytes) -> dict[str, dict[str, Any]]:
    """A stored spread as ``{metric: {"min", "max", "min_device", "max_device"}}``."""
    head, _, data = bytes(stored).partition(b"\n")
    names = orjson.loads(head)
    rows = np.frombuffer(data, dtype=ROW, count=len(names)).tolist()
    return {
        name: {"min": low, "max": high, "min_device": low_device, "max_device": high_device}
        for name, (low, high, low_device, high_device) in zip(names, rows, strict=True)
        if low == low  # NaN: no spread of this metric at this step
    }


def spread_text(stored: bytes) -> str:
    """A stored spread as the JSON text of :func:`decode_row`."""
    return orjson.dumps(decode_row(stored)).decode()


def _columns_of(spreads: Sequence[SpreadOf]) -> tuple[list[int], dict[str, SpreadColumn]]:
    names = list(dict.fromkeys(name for _, spread in spreads for name in spread))
    count = len(spreads)
    columns: dict[str, SpreadColumn] = {}
    for name in names:
        entries = [spread.get(name) for _, spread in spreads]
        has = np.array([e is not None for e in entries], dtype=bool)
        columns[name] = (
            has,
            np.array([e["min"] if e else np.nan for e in entries], dtype=np.float64),
            np.array([e["min_device"] if e else 0 for e in entries], dtype=np.int64),
            np.array([e["max"] if e else np.nan for e in entries], dtype=np.float64),
            np.array([e["max_device"] if e else 0 for e in entries], dtype=np.int64),
        )
    del count
    return [step for step, _ in spreads], columns


def write_spreads(conn: Connection, job: str, spreads: Sequence[SpreadOf]) -> None:
    """Stores new steps' spreads and merges them into their blocks (inside the push's
    transaction; the steps are new, so no row exists for them)."""
    if not spreads:
        return
    steps, columns = _columns_of(spreads)
    write_spread_columns(conn, job, steps, columns, encode_rows(columns, len(steps)))


def write_spread_columns(
    conn: Connection,
    job: str,
    steps: Sequence[int],
    columns: dict[str, SpreadColumn],
    stored: Sequence[bytes | None],
) -> None:
    """:func:`write_spreads` of a batch given as columns (no mapping per step): each
    step's stored spread (:func:`encode_rows`; None: none) and, per metric, its columns."""
    conn.executemany(
        Statement(
            "INSERT INTO job_spreads (job, step, spread) VALUES (?, ?, ?)",
            "INSERT INTO job_spreads (job, step, spread) VALUES (%s, %s, %s)",
            ArrayInsert(
                "INSERT INTO job_spreads (job, step, spread) SELECT u.c0, u.c1, u.c2 FROM "
                "unnest(%b::text[], %b::bigint[], %b::bytea[]) AS u(c0, c1, c2)",
                ("text", "bigint", "bytea"),
                (),
            ),
        ),
        [(job, step, row) for step, row in zip(steps, stored, strict=True) if row],
    )
    step_array = np.asarray(steps, dtype=np.int64)
    rows: list[tuple] = []  # every metric's blocks in one statement (their keys differ)
    for name, (has, low, low_device, high, high_device) in columns.items():
        if not has.any():
            continue
        rows += _block_rows(
            job,
            name,
            step_array[has],
            low[has],
            low_device[has],
            high[has],
            high_device[has],
        )
    if rows:
        conn.executemany(SPREAD_UPSERT, rows)


def spreads_between(
    conn: Connection, job: str, low: int, high: int
) -> dict[int, dict[str, dict[str, Any]]]:
    """step -> spread of the job's steps in ``[low, high]`` that have one."""
    return {
        step: decode_row(stored)
        for step, stored in conn.execute(
            Statement(
                "SELECT step, spread FROM job_spreads WHERE job = ? AND step BETWEEN ? AND ?",
                "SELECT step, spread FROM job_spreads WHERE job = %s AND step BETWEEN %s AND %s",
            ),
            (job, low, high),
        )
    }


def spread_blocks(conn: Connection, job: str, level: int, first: int, last: int) -> list[tuple]:
    """``(metric, block, low, low_device, low_step, high, high_device, high_step)`` of the
    job's blocks of ``level`` numbered ``first`` to ``last``."""
    return conn.execute(
        Statement(
            "SELECT metric, block, low, low_device, low_step, high, high_device, high_step "
            "FROM job_spread_blocks WHERE job = ? AND level = ? AND block BETWEEN ? AND ?",
            "SELECT metric, block, low, low_device, low_step, high, high_device, high_step "
            "FROM job_spread_blocks WHERE job = %s AND level = %s AND block BETWEEN %s AND %s",
        ),
        (job, level, first, last),
    ).fetchall()
