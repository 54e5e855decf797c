"""The job tables of the store: metric points, multi-source parts, rollups, the jobs list.

Plain functions over an open ``sqlite3.Connection``; :class:`app.storage.db.Store` runs them in
its transactions (writes inside ``BEGIN IMMEDIATE``, so SQLite's write lock serialises
every read-check-write below: no two pushes can interleave, in this process or another
one on the same file).

Tables (schema version 4; their schemas and migrations are in :mod:`app.storage.migrations`):

- ``job_points (job, step)``: one row per *complete* step: the reduced values as the JSON
  text the API answers, ``digest`` of what was pushed (idempotency), ``sources``.
- ``job_segments``: multi-source parts (``sources`` > 1), one row per source and push,
  merged into ``job_points`` as steps complete (:mod:`app.storage.parts`).
- ``job_rollups (job, level, metric, block)``: for each scalar metric, per block of
  ``16**level`` steps (levels 1-4: 16, 256, 4,096 and 65,536 steps): count, sum, min and
  max of the finite values, and the last value. Downsampled reads aggregate these blocks
  instead of every point: a 1,000-bucket read of a 1,000,000-step job reads ~4,000 rows
  per metric, not 1,000,000.
- ``jobs (job)``: points, first and last step, ``last_push_at``, ``finished``.
- Versions 2 and 3 kept parts one row per (job, step, source) (``job_parts``) and a row
  per incomplete step (``job_pending``); their schemas stay in :mod:`app.storage.migrations`.

Bounds: a batch is at most 1,000 points (checked by the service); a history page at
most ``MAX_PAGE`` points; a downsampled read at most ``MAX_BUCKETS`` buckets.
"""

from __future__ import annotations

import itertools
import json
import math
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.core.errors import PartMismatch, SourcesMismatch, StepConflict
from app.storage.part_blobs import decode_part
from app.storage.parts import (
    MergedStep,
    MergeRows,
    PartSegment,
    PendingStep,
    incomplete_jobs,
    missing_sources,
    newest_incomplete,
    open_sources,
    pending_steps,
    push_segment,
    source_order,
    step_sources,
)

__all__ = ["MergedStep", "PendingStep", "missing_sources", "source_order"]

FANOUT_BITS = 4
"""Rollup blocks grow 16x per level."""
LEVELS = (1, 2, 3, 4)
MAX_PAGE = 10_000
MAX_BUCKETS = 10_000
_IN_CHUNK = 500  # variables per IN (...) list, far below SQLite's limit


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


# ----------------------------------------------------------------------------- rollups


def _rollup_rows(job: str, points: Sequence[tuple[int, dict[str, float]]]) -> list[tuple]:
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
    return _rollup_rows_of_columns(
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


def _rollup_rows_of_columns(
    job: str, columns: dict[str, tuple[np.ndarray, np.ndarray]]
) -> list[tuple]:
    """:func:`_rollup_rows` of ``metric -> (steps [P] int64, values [P] float64)``: the
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


ROLLUP_UPSERT = (
    "INSERT INTO job_rollups (job, level, metric, block, n, total, low, high, last_step, "
    "last) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (job, level, metric, block) DO UPDATE SET "
    "n = n + excluded.n, total = total + excluded.total, "
    "low = coalesce(min(low, excluded.low), low, excluded.low), "
    "high = coalesce(max(high, excluded.high), high, excluded.high), "
    "last = CASE WHEN excluded.last_step > last_step THEN excluded.last ELSE last END, "
    "last_step = max(last_step, excluded.last_step)"
)
"""Adds a block's aggregate to what the block holds, in one statement."""


def write_rollups(
    conn: sqlite3.Connection, job: str, points: Sequence[tuple[int, dict[str, float]]]
) -> None:
    """Adds points to their blocks, merging with what the blocks hold, in one statement
    per row (``ON CONFLICT DO UPDATE``: SQLite's own atomicity, no read-modify-write)."""
    if not points:
        return
    conn.executemany(ROLLUP_UPSERT, _rollup_rows(job, points))


# ------------------------------------------------------------------------------- writes


@dataclass
class PushItem:
    """One pushed point or part, decoded and checked by the service.

    ``sources == 1``: a complete step; ``reduced`` (JSON text) and ``values`` (scalars for
    the rollups) are set. ``sources > 1``: a part; ``arrays`` (npz bytes) is set, and
    ``signature`` (metric names, per-device shapes, options) must equal the step's other
    parts'.
    """

    step: int
    source: str
    sources: int
    digest: str
    num_devices: int
    signature: str = ""
    reduced: str | None = None
    values: dict[str, float] = field(default_factory=dict)
    arrays: bytes | None = None
    # filled in by push():
    created: bool = False
    complete: bool = False
    step_reduced: str | None = None
    missing: list[str] | None = None
    received_at: str = ""


def _chunks(values: Sequence[Any]) -> Iterable[Sequence[Any]]:
    for start in range(0, len(values), _IN_CHUNK):
        yield values[start : start + _IN_CHUNK]


def _select_in(
    conn: sqlite3.Connection, sql: str, job: str, steps: Sequence[int]
) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    if not steps:
        return rows
    low, high = min(steps), max(steps)
    if high - low < 2 * len(steps) + 64:
        # Mostly consecutive steps (the usual batch): one range seek.
        return conn.execute(sql.format(where="step BETWEEN ? AND ?"), (job, low, high)).fetchall()
    for chunk in _chunks(sorted(set(steps))):
        marks = ",".join("?" * len(chunk))
        rows += conn.execute(sql.format(where=f"step IN ({marks})"), (job, *chunk)).fetchall()
    return rows


MISSING_NAMED_UP_TO = 16
"""Pushes of at most this many items learn the names of the sources still missing
(``PushItem.missing``, in single-push answers); larger batches count them only."""


def _where(index: int, item: PushItem) -> str:
    return f"points[{index}] (step {item.step}, source {item.source!r})"


def _stored_points(
    conn: sqlite3.Connection, job: str, steps: Sequence[int]
) -> dict[int, tuple[Any, ...]]:
    """``step -> (step, digest, sources, reduced, received_at)`` of the stored points."""
    return {
        row[0]: row
        for row in _select_in(
            conn,
            "SELECT step, digest, sources, reduced, received_at FROM job_points "
            "WHERE job = ? AND {where}",
            job,
            steps,
        )
    }


def _segments_of(items: Sequence[tuple[int, PushItem]]) -> list[tuple[PartSegment, list[PushItem]]]:
    """The parts of a push grouped into one segment per (source, sources, signature,
    device count), in push order; each part's stored bytes decoded and stacked."""
    groups: dict[tuple, list[tuple[int, PushItem]]] = {}
    for index, item in items:
        key = (item.source, item.sources, item.signature, item.num_devices)
        groups.setdefault(key, []).append((index, item))
    out = []
    for (source, sources, signature, num_devices), members in groups.items():
        decoded = [decode_part(item.arrays or b"") for _, item in members]
        names = list(decoded[0])
        if any(list(d) != names for d in decoded):  # a signature names the same metrics
            raise PartMismatch(
                f"{_where(members[0][0], members[0][1])}: the parts of one source name other "
                "metrics"
            )
        columns = {n: np.stack([np.asarray(d[n]) for d in decoded]) for n in names}
        segment = PartSegment(
            source=source,
            sources=sources,
            signature=signature,
            num_devices=num_devices,
            steps=[item.step for _, item in members],
            columns=columns,
            positions=[index for index, _ in members],
        )
        out.append((segment, [item for _, item in members]))
    return out


def push(
    conn: sqlite3.Connection, job: str, items: list[PushItem], now: str, merge: MergeRows
) -> int:
    """Stores a batch of points and parts, all or nothing (call inside a transaction).

    Complete steps (``sources == 1``) are rows of ``job_points``; parts are stored one
    segment per source (:mod:`app.storage.parts`), and the steps they complete merged.
    Per item sets ``created``, ``complete``, ``step_reduced`` and (pushes of at most
    ``MISSING_NAMED_UP_TO`` items) ``missing``. Returns the number of steps that became
    complete.

    Raises:
      StepConflict: a step (``sources == 1``) or a part (per source) stored with other
        content, or a new source for a step that has all its sources.
      SourcesMismatch: ``sources`` differs from the step's.
      PartMismatch: a part whose metrics or device count differ from the step's parts.
    """
    for item in items:
        # From scratch: a group commit may run a push again after rolling it back.
        item.created = item.complete = False
        item.step_reduced = item.missing = None
        item.received_at = now
    singles = [(i, item) for i, item in enumerate(items) if item.sources == 1]
    stored = _stored_points(conn, job, [item.step for item in items])
    held = open_sources(conn, job, [item.step for _, item in singles])
    new_points: dict[int, PushItem] = {}
    for index, item in singles:
        row = stored.get(item.step)
        known = held.get(item.step, row[2] if row else None)
        if known is not None and known != 1:
            raise SourcesMismatch(
                f"{_where(index, item)}: sources=1, but the step has sources={known}; every "
                "part of a step must give the same number of sources"
            )
        previous = new_points.get(item.step)
        if previous is not None:
            if previous.digest != item.digest:
                raise StepConflict(
                    f"{_where(index, item)}: the batch holds this step twice, differently"
                )
            continue
        if row is not None:
            if row[1] and len(row[1]) == len(item.digest):
                same = item.digest == row[1]
            else:  # stored before digests (NULL) or with the older digest format
                same = item.reduced == row[3]
            if not same:
                raise StepConflict(
                    f"{_where(index, item)}: step {item.step} of job {job!r} is stored with "
                    "other content; steps are written once (a retry must send the same "
                    "content)"
                )
            item.complete, item.step_reduced, item.received_at = True, row[3], row[4]
            continue
        item.created = item.complete = True
        item.step_reduced = item.reduced
        new_points[item.step] = item
    if new_points:
        conn.executemany(
            "INSERT INTO job_points (job, step, reduced, received_at, digest, sources, "
            "num_devices) VALUES (?, ?, ?, ?, ?, 1, ?)",
            [(job, i.step, i.reduced, now, i.digest, i.num_devices) for i in new_points.values()],
        )
    rollup = [(i.step, i.values) for i in new_points.values()]
    for i in new_points.values():  # a part of the same step in this push must see it
        stored[i.step] = (i.step, i.digest, 1, i.reduced, now)
    parts = [(i, item) for i, item in enumerate(items) if item.sources > 1]
    completed = 0
    wrote_parts = False
    for segment, members in _segments_of(parts):
        done, done_rollup = push_segments(conn, job, [segment], now, merge, stored)
        completed += done
        rollup += done_rollup
        wrote_parts = wrote_parts or segment.created > 0
        for item in members:
            created, reduced, received_at = segment.outcome(item.step)
            item.created = created
            item.complete = reduced is not None
            item.step_reduced = reduced
            item.received_at = received_at
        if len(items) <= MISSING_NAMED_UP_TO:
            for item in members:
                if not item.complete:
                    item.missing = missing_sources(step_sources(conn, job, item.step), item.sources)
    write_rollups(conn, job, rollup)
    if new_points or wrote_parts:
        added = [step for step, _ in rollup]
        low, high = min(added, default=None), max(added, default=None)
        _count_points(conn, job, now, len(added), low, high)
    return completed


def push_segments(
    conn: sqlite3.Connection,
    job: str,
    segments: Sequence[PartSegment],
    now: str,
    merge: MergeRows,
    stored: dict[int, tuple[Any, ...]] | None = None,
) -> tuple[int, list[tuple[int, dict[str, float]]]]:
    """Stores segments of parts (:func:`app.storage.parts.push_segment`) and writes the
    steps they complete into ``job_points``; returns the count completed and their rollup
    input (the caller writes the rollups and the job row)."""
    completed = 0
    rollup: list[tuple[int, dict[str, float]]] = []
    for segment in segments:
        rows = stored if stored is not None else _stored_points(conn, job, segment.steps)
        mine = set(segment.steps)
        points = {step: (int(row[2]), row[3], row[4]) for step, row in rows.items() if step in mine}
        done, done_rollup, point_rows = push_segment(conn, job, segment, now, merge, points)
        if point_rows:
            conn.executemany(
                "INSERT INTO job_points (job, step, reduced, received_at, digest, sources, "
                "num_devices) VALUES (?, ?, ?, ?, ?, ?, ?)",
                point_rows,
            )
            if stored is not None:
                for row in point_rows:
                    stored[row[1]] = (row[1], None, row[5], row[2], row[3])
        completed += len(done)
        rollup += done_rollup
    return completed, rollup


def push_part_columns(
    conn: sqlite3.Connection, job: str, segment: PartSegment, now: str, merge: MergeRows
) -> tuple[int, int]:
    """One source's parts of a batch, stored as one segment (all or nothing; call inside a
    transaction); returns (parts newly stored, steps completed)."""
    completed, rollup = push_segments(conn, job, [segment], now, merge)
    created = segment.created
    write_rollups(conn, job, rollup)
    if created:
        added = [step for step, _ in rollup]
        low, high = min(added, default=None), max(added, default=None)
        _count_points(conn, job, now, len(added), low, high)
    return created, completed


@dataclass
class PointColumns:
    """A batch of complete steps (``sources == 1``) as columns, as the service's
    vectorised path decodes it: no object per point. ``values`` holds every scalar metric
    of the reduced points, ``[P]`` float64 (NaN for null)."""

    steps: list[int]
    digests: list[str]
    reduced: list[str]
    values: dict[str, np.ndarray]
    num_devices: int
    source: str = ""

    def __len__(self) -> int:
        return len(self.steps)

    def items(self) -> list[PushItem]:
        """The same batch as :class:`PushItem` s (for :func:`push`)."""
        names = list(self.values)
        rows = zip(*(self.values[name].tolist() for name in names), strict=True)
        return [
            PushItem(
                step=step,
                source=self.source,
                sources=1,
                digest=digest,
                num_devices=self.num_devices,
                reduced=text,
                values=dict(zip(names, row, strict=True)),
            )
            for step, digest, text, row in zip(
                self.steps, self.digests, self.reduced, rows, strict=True
            )
        ]


def _any_in(conn: sqlite3.Connection, table: str, job: str, steps: Sequence[int]) -> bool:
    """Whether ``table`` holds a row of ``job`` at any of ``steps`` (one range seek for
    mostly consecutive steps)."""
    low, high = min(steps), max(steps)
    if high - low < 2 * len(steps) + 64:
        sql = f"SELECT 1 FROM {table} WHERE job = ? AND step BETWEEN ? AND ? LIMIT 1"
        return conn.execute(sql, (job, low, high)).fetchone() is not None
    return bool(
        _select_in(conn, f"SELECT step FROM {table} WHERE job = ? AND {{where}}", job, steps)
    )


def columns_rollup_rows(job: str, batch: PointColumns) -> list[tuple]:
    """The rollup rows of a batch of complete steps (:data:`ROLLUP_UPSERT` parameters), to
    compute before the write: the store's lock is then held for SQLite's work only."""
    step_array = np.asarray(batch.steps, dtype=np.int64)
    return _rollup_rows_of_columns(job, {k: (step_array, v) for k, v in batch.values.items()})


def push_columns(
    conn: sqlite3.Connection,
    job: str,
    batch: PointColumns,
    now: str,
    merge: MergeRows,
    rollup_rows: list[tuple] | None = None,
) -> tuple[int, list[PushItem] | None]:
    """Stores a batch of complete steps, all or nothing (call inside a transaction);
    returns how many steps were new and, when the batch took :func:`push`'s path, its items.

    The usual batch (new steps, each once) is written straight from the columns: one
    range seek in ``job_points`` and one in the open segments prove no step is stored or
    pending, then the rows, the rollups and the job row. Any other batch (a retry, a
    repeated step, a clash with a multi-source step) is exactly :func:`push` of
    :meth:`PointColumns.items`, with its errors. ``rollup_rows``: the batch's
    :func:`columns_rollup_rows`, when the caller computed them outside the transaction.
    """
    steps = batch.steps
    if (
        not steps
        or len(set(steps)) != len(steps)
        or _any_in(conn, "job_points", job, steps)
        or open_sources(conn, job, steps)
    ):
        items = batch.items()
        push(conn, job, items, now, merge)
        return sum(1 for item in items if item.created), items
    count = len(steps)
    conn.executemany(
        "INSERT INTO job_points (job, step, reduced, received_at, digest, sources, "
        "num_devices) VALUES (?, ?, ?, ?, ?, 1, ?)",
        zip(
            itertools.repeat(job, count),
            steps,
            batch.reduced,
            itertools.repeat(now, count),
            batch.digests,
            itertools.repeat(batch.num_devices, count),
            strict=True,
        ),
    )
    if rollup_rows is None:
        rollup_rows = columns_rollup_rows(job, batch)
    conn.executemany(ROLLUP_UPSERT, rollup_rows)
    _count_points(conn, job, now, count, min(steps), max(steps))
    return count, None


def _count_points(
    conn: sqlite3.Connection, job: str, now: str, added: int, low: int | None, high: int | None
) -> None:
    """The job row: created on its first push, then its point count, step range and last
    push time."""
    conn.execute(
        "INSERT INTO jobs (job, created_at, last_push_at, points, first_step, last_step) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (job) DO UPDATE SET "
        "last_push_at = excluded.last_push_at, points = points + excluded.points, "
        "first_step = coalesce(min(first_step, excluded.first_step), first_step, "
        "excluded.first_step), "
        "last_step = coalesce(max(last_step, excluded.last_step), last_step, "
        "excluded.last_step)",
        (job, now, now, added, low, high),
    )


def delete_job(conn: sqlite3.Connection, job: str) -> bool:
    """Deletes a job and all its rows; False when there was no such job."""
    found = conn.execute("DELETE FROM jobs WHERE job = ?", (job,)).rowcount > 0
    for table in ("job_points", "job_segments", "job_coverage", "job_rollups"):
        found = conn.execute(f"DELETE FROM {table} WHERE job = ?", (job,)).rowcount > 0 or found
    return found


def set_finished(conn: sqlite3.Connection, job: str, finished: bool) -> bool:
    return (
        conn.execute("UPDATE jobs SET finished = ? WHERE job = ?", (int(finished), job)).rowcount
        > 0
    )


def expire_jobs(conn: sqlite3.Connection, pushed_before: str, limit: int = 100) -> list[str]:
    """Deletes up to ``limit`` jobs whose last push is older than ``pushed_before``."""
    jobs = [
        row[0]
        for row in conn.execute(
            "SELECT job FROM jobs WHERE last_push_at < ? ORDER BY last_push_at LIMIT ?",
            (pushed_before, limit),
        )
    ]
    for job in jobs:
        delete_job(conn, job)
    return jobs


# -------------------------------------------------------------------------------- reads


@dataclass(frozen=True)
class JobRow:
    job: str
    points: int
    first_step: int | None
    last_step: int | None
    last_push_at: str
    finished: bool
    created_at: str
    incomplete_step: int | None = None
    incomplete_sources: int | None = None
    received_sources: list[str] = field(default_factory=list)


def _job_row(conn: sqlite3.Connection, row: tuple) -> JobRow:
    job = row[0]
    found = newest_incomplete(conn, job)
    return JobRow(
        job=job,
        points=int(row[1]),
        first_step=row[2],
        last_step=row[3],
        last_push_at=row[4],
        finished=bool(row[5]),
        created_at=row[6],
        incomplete_step=None if found is None else found[0],
        incomplete_sources=None if found is None else found[1],
        received_sources=[] if found is None else found[2],
    )


_JOB_COLUMNS = "job, points, first_step, last_step, last_push_at, finished, created_at"


def list_jobs(conn: sqlite3.Connection, limit: int, offset: int) -> tuple[list[JobRow], int]:
    """Jobs, most recently pushed first, and the total."""
    total = conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
    rows = conn.execute(
        f"SELECT {_JOB_COLUMNS} FROM jobs ORDER BY last_push_at DESC, job LIMIT ? OFFSET ?",
        (limit, offset),
    ).fetchall()
    return [_job_row(conn, row) for row in rows], int(total)


def get_job(conn: sqlite3.Connection, job: str) -> JobRow | None:
    row = conn.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job = ?", (job,)).fetchone()
    return None if row is None else _job_row(conn, row)


@dataclass(frozen=True)
class StoredPoint:
    step: int
    reduced: str
    received_at: str
    sources: int


POINT_OVERHEAD = 100
"""Bytes a history row adds to its reduced text (step, received_at, member names), at
most: what :func:`history_page` counts against its byte budget."""


def history_page(
    conn: sqlite3.Connection,
    job: str,
    low: int,
    high: int,
    limit: int,
    include_partial: bool,
    max_bytes: int | None = None,
) -> tuple[list[StoredPoint | PendingStep], bool]:
    """Steps in ``[low, high]`` in step order, at most ``limit``; True when more follow.

    ``max_bytes``: the stored points read stop once their text (plus
    :data:`POINT_OVERHEAD` each) would pass it, so a page never holds more than the
    answer limit in memory; at least one point is read (the caller refuses it if it alone
    is too large). A page cut short says more follow, and holds no step beyond the first
    point or partial step it left out (the next page starts there); partial steps are
    bounded alike by the bytes of stored parts they read
    (:func:`app.storage.parts.pending_steps`).
    """
    points: list[StoredPoint] = []
    boundary: int | None = None  # first complete step left out for the byte budget
    used = 0
    for s, r, t, n in conn.execute(
        "SELECT step, reduced, received_at, sources FROM job_points "
        "WHERE job = ? AND step BETWEEN ? AND ? ORDER BY step LIMIT ?",
        (job, low, high, limit + 1),
    ):
        used += len(r) + POINT_OVERHEAD
        if max_bytes is not None and points and used > max_bytes:
            boundary = int(s)
            break
        points.append(StoredPoint(int(s), r, t, int(n)))
    entries: list[StoredPoint | PendingStep] = list(points)
    if include_partial:
        top = high if boundary is None else boundary
        pending, dropped = pending_steps(conn, job, low, top, limit + 1, max_bytes)
        if dropped is not None:  # the page ends before the first partial step left out
            boundary = dropped if boundary is None else min(boundary, dropped)
        entries += pending
        if boundary is not None:
            entries = [e for e in entries if e.step < boundary]
        entries.sort(key=lambda e: e.step)
    more = len(entries) > limit or boundary is not None
    return entries[:limit], more


def metric_names(conn: sqlite3.Connection, job: str, low: int, high: int) -> list[str]:
    """The scalar metrics with a value in ``[low, high]`` (or in the 65,536-step blocks
    around it): what a downsampled read of the range answers, for sizing it first. Reads
    the top rollup level: a row per metric and 65,536 steps."""
    shift = FANOUT_BITS * LEVELS[-1]
    return [
        row[0]
        for row in conn.execute(
            "SELECT DISTINCT metric FROM job_rollups WHERE job = ? AND level = ? "
            "AND block BETWEEN ? AND ?",
            (job, LEVELS[-1], low >> shift, high >> shift),
        )
    ]


def count_points(conn: sqlite3.Connection, job: str, low: int, high: int, cap: int) -> int:
    """Complete points in ``[low, high]``, counted up to ``cap``."""
    return conn.execute(
        "SELECT COUNT(*) FROM (SELECT 1 FROM job_points WHERE job = ? AND step BETWEEN ? AND ? "
        "LIMIT ?)",
        (job, low, high, cap),
    ).fetchone()[0]


@dataclass
class Bucket:
    """One downsampled bucket: per metric [n, sum, min, max, last_step, last]."""

    start: int
    end: int
    metrics: dict[str, list[Any]] = field(default_factory=dict)

    def add(self, metric: str, n, total, low, high, last_step, last) -> None:  # noqa: ANN001
        entry = self.metrics.get(metric)
        if entry is None:
            self.metrics[metric] = [n, total, low, high, last_step, last]
            return
        entry[0] += n
        entry[1] += total
        if low is not None:
            entry[2] = low if entry[2] is None else min(entry[2], low)
        if high is not None:
            entry[3] = high if entry[3] is None else max(entry[3], high)
        if last_step > entry[4]:
            entry[4], entry[5] = last_step, last


def _segments(low: int, high: int, top: int) -> list[tuple[int, int, int]]:
    """Covers ``[low, high]`` with runs ``(level, first, last)`` of whole blocks (level 0:
    single steps), using levels up to ``top``: fine blocks at the ragged edges, level
    ``top`` blocks in the middle. At most ``2 * top + 1`` runs."""
    runs: list[tuple[int, int, int]] = []
    position = low
    while position <= high:
        level = 0
        for candidate in range(top, 0, -1):
            size = 1 << (FANOUT_BITS * candidate)
            if position % size == 0 and position + size - 1 <= high:
                level = candidate
                break
        size = 1 << (FANOUT_BITS * level)
        # Run whole blocks of this level up to the next boundary of the level above (or
        # to the end of the range at the top level).
        if level < top:
            boundary = (position // (size << FANOUT_BITS) + 1) * (size << FANOUT_BITS)
            stop = min(boundary - 1, high)
        else:
            stop = high
        count = (stop - position + 1) // size
        if count == 0:
            count = 1  # level 0 always fits
        first = position >> (FANOUT_BITS * level)
        runs.append((level, first, first + count - 1))
        position += count * size
    return runs


def _add_blocks(rows, metric, base, per_bucket, origin, width, bucket) -> None:  # noqa: ANN001
    """Adds one metric's rollup rows (ascending blocks) to their buckets."""
    columns = list(zip(*rows, strict=True))
    index = (np.asarray(columns[1], dtype=np.int64) - base) // per_bucket
    n = np.asarray(columns[2], dtype=np.int64)
    total = np.asarray(columns[3], dtype=np.float64)
    low = np.asarray(columns[4], dtype=np.float64)  # None -> NaN, skipped by fmin
    high = np.asarray(columns[5], dtype=np.float64)
    starts = np.flatnonzero(np.r_[True, index[1:] != index[:-1]])
    ends = np.r_[starts[1:], index.size] - 1
    sums = np.add.reduceat(total, starts).tolist()
    counts = np.add.reduceat(n, starts).tolist()
    lows = np.fmin.reduceat(low, starts).tolist()
    highs = np.fmax.reduceat(high, starts).tolist()
    last_steps, lasts = columns[6], columns[7]
    for k, (group, end) in enumerate(zip(index[starts].tolist(), ends.tolist(), strict=True)):
        lo, hi = lows[k], highs[k]
        bucket(origin + group * width).add(
            metric,
            counts[k],
            sums[k],
            None if lo != lo else lo,  # NaN: no finite value in the bucket
            None if hi != hi else hi,
            last_steps[end],
            lasts[end],
        )


def downsample(
    conn: sqlite3.Connection, job: str, low: int, high: int, max_points: int
) -> tuple[int, list[Bucket]]:
    """At most ``max_points`` buckets over ``[low, high]``; returns (bucket width, buckets).

    Buckets are aligned so that each holds whole rollup blocks; their width is a multiple
    of the block size chosen, at least ``(high - low + 1) / max_points`` steps.
    """
    needed = -(-(high - low + 1) // max_points)
    top = 0
    for level in LEVELS:
        # A block up to twice the width needed still gives at least max_points / 2
        # buckets, and reads up to 16x fewer rows than the level below.
        if (1 << (FANOUT_BITS * level)) <= 2 * needed:
            top = level
    block = 1 << (FANOUT_BITS * top)
    origin = low - low % block
    width_needed = -(-(high - origin + 1) // max_points)
    width = -(-width_needed // block) * block
    buckets: dict[int, Bucket] = {}

    def bucket(step: int) -> Bucket:
        index = (step - origin) // width
        found = buckets.get(index)
        if found is None:
            start = origin + index * width
            found = buckets[index] = Bucket(max(start, low), min(start + width - 1, high))
        return found

    for level, first, last in _segments(low, high, top):
        if level == 0:
            for step, reduced in conn.execute(
                "SELECT step, reduced FROM job_points WHERE job = ? AND step BETWEEN ? AND ?",
                (job, first, last),
            ):
                target = bucket(step)
                for name, value in scalar_values(json.loads(reduced)).items():
                    ok = math.isfinite(value)
                    target.add(
                        name,
                        int(ok),
                        value if ok else 0.0,
                        value if ok else None,
                        value if ok else None,
                        step,
                        value if ok else None,
                    )
            continue
        shift = FANOUT_BITS * level
        per_bucket = width >> shift  # blocks per bucket
        base = origin >> shift
        # In primary-key order (metric, then block): no sort; aggregated with numpy, one
        # pass (two GROUP BY queries, for min/max/sum and for the last value, cost ~3x).
        rows = conn.execute(
            "SELECT metric, block, n, total, low, high, last_step, last FROM job_rollups "
            "WHERE job = ? AND level = ? AND block BETWEEN ? AND ?",
            (job, level, first, last),
        ).fetchall()
        start = 0
        while start < len(rows):
            metric = rows[start][0]
            stop = start
            while stop < len(rows) and rows[stop][0] == metric:
                stop += 1
            _add_blocks(rows[start:stop], metric, base, per_bucket, origin, width, bucket)
            start = stop
    return width, [buckets[i] for i in sorted(buckets)]


def gauges(conn: sqlite3.Connection, top: int) -> tuple[list[tuple[str, str]], list[tuple]]:
    """Unfinished jobs with their last push (most recent first, ``top + 1`` at most, the
    extra one marking "more"), and pending multi-source steps per job."""
    stale = conn.execute(
        "SELECT job, last_push_at FROM jobs WHERE finished = 0 ORDER BY last_push_at DESC LIMIT ?",
        (top + 1,),
    ).fetchall()
    oldest_rest = conn.execute(
        "SELECT MIN(last_push_at), COUNT(*) FROM (SELECT last_push_at FROM jobs "
        "WHERE finished = 0 ORDER BY last_push_at DESC LIMIT -1 OFFSET ?)",
        (top,),
    ).fetchone()
    pending = incomplete_jobs(conn)
    return [*stale[:top], *([("", oldest_rest[0])] if oldest_rest[1] else [])], pending
