"""Reads of job history: the jobs list, pages of stored points, downsampled buckets
(from the rollups of :mod:`app.storage.rollups`), and the job gauges.

Plain functions over an open ``Connection`` (for the store's tests and
benchmarks), and the typed async functions the services call, which run them in
:meth:`app.storage.db.Store.read`.

Bounds: a history page holds at most ``MAX_PAGE`` points and the byte budget given; a
downsampled read at most ``MAX_BUCKETS`` buckets and ~16 rollup rows per bucket and metric.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from app.storage.parts import PendingStep, incomplete_jobs, newest_incomplete, pending_steps
from app.storage.rollups import FANOUT_BITS, LEVELS, scalar_values
from app.storage.spreads import spread_blocks, spread_text, spreads_between
from app.storage.store import Connection, Statement

if TYPE_CHECKING:
    from app.storage.store import Store

MAX_PAGE = 10_000
MAX_BUCKETS = 10_000


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


def _job_row(conn: Connection, row: tuple) -> JobRow:
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


def list_jobs(conn: Connection, limit: int, offset: int) -> tuple[list[JobRow], int]:
    """Jobs, most recently pushed first, and the total."""
    total = conn.execute(
        Statement(
            "SELECT COUNT(*) FROM jobs",
            "SELECT COUNT(*) FROM jobs",
        )
    ).fetchone()[0]
    rows = conn.execute(
        Statement(
            f"SELECT {_JOB_COLUMNS} FROM jobs ORDER BY last_push_at DESC, job LIMIT ? OFFSET ?",
            f"SELECT {_JOB_COLUMNS} FROM jobs ORDER BY last_push_at DESC, job LIMIT %s OFFSET %s",
        ),
        (limit, offset),
    ).fetchall()
    return [_job_row(conn, row) for row in rows], int(total)


def get_job(conn: Connection, job: str) -> JobRow | None:
    row = conn.execute(
        Statement(
            f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job = ?",
            f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job = %s",
        ),
        (job,),
    ).fetchone()
    return None if row is None else _job_row(conn, row)


@dataclass(frozen=True)
class StoredPoint:
    step: int
    reduced: str
    received_at: str
    sources: int
    spread: str | None = None  # over devices, JSON text (app.storage.spreads)


POINT_OVERHEAD = 100
"""Bytes a history row adds to its reduced text (step, received_at, member names), at
most: what :func:`history_page` counts against its byte budget."""


def history_page(
    conn: Connection,
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
    for s, r, t, n, d in conn.execute(
        Statement(
            "SELECT p.step, p.reduced, p.received_at, p.sources, d.spread FROM job_points p "
            "LEFT JOIN job_spreads d ON d.job = p.job AND d.step = p.step "
            "WHERE p.job = ? AND p.step BETWEEN ? AND ? ORDER BY p.step LIMIT ?",
            "SELECT p.step, p.reduced, p.received_at, p.sources, d.spread FROM job_points p "
            "LEFT JOIN job_spreads d ON d.job = p.job AND d.step = p.step "
            "WHERE p.job = %s AND p.step BETWEEN %s AND %s ORDER BY p.step LIMIT %s",
        ),
        (job, low, high, limit + 1),
    ):
        text = spread_text(d) if d else None
        used += len(r) + POINT_OVERHEAD + (len(text) + 12 if text else 0)
        if max_bytes is not None and points and used > max_bytes:
            boundary = int(s)
            break
        points.append(StoredPoint(int(s), r, t, int(n), text))
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


def metric_names(conn: Connection, job: str, low: int, high: int) -> list[str]:
    """The scalar metrics with a value in ``[low, high]`` (or in the 65,536-step blocks
    around it): what a downsampled read of the range answers, for sizing it first. Reads
    the top rollup level: a row per metric and 65,536 steps."""
    shift = FANOUT_BITS * LEVELS[-1]
    return [
        row[0]
        for row in conn.execute(
            Statement(
                "SELECT DISTINCT metric FROM job_rollups WHERE job = ? AND level = ? "
                "AND block BETWEEN ? AND ?",
                "SELECT DISTINCT metric FROM job_rollups WHERE job = %s AND level = %s "
                "AND block BETWEEN %s AND %s",
            ),
            (job, LEVELS[-1], low >> shift, high >> shift),
        )
    ]


def count_points(conn: Connection, job: str, low: int, high: int, cap: int) -> int:
    """Complete points in ``[low, high]``, counted up to ``cap``."""
    return conn.execute(
        Statement(
            "SELECT COUNT(*) FROM (SELECT 1 FROM job_points WHERE job = ? AND step BETWEEN ? AND ? "
            "LIMIT ?) AS counted",
            "SELECT COUNT(*) FROM (SELECT 1 FROM job_points WHERE job = %s AND step BETWEEN %s "
            "AND %s "
            "LIMIT %s) AS counted",
        ),
        (job, low, high, cap),
    ).fetchone()[0]


@dataclass
class Bucket:
    """One downsampled bucket: per metric [n, sum, min, max, last_step, last]."""

    start: int
    end: int
    metrics: dict[str, list[Any]] = field(default_factory=dict)
    # per metric [low, low_device, low_step, high, high_device, high_step] of the spreads
    spread: dict[str, list[Any]] = field(default_factory=dict)

    def add_spread(self, metric: str, low: list[Any], high: list[Any]) -> None:
        """Merges one step's or block's extremes (``[value, device, step]`` each)."""
        entry = self.spread.get(metric)
        if entry is None:
            self.spread[metric] = [*low, *high]
            return
        if low[0] < entry[0]:
            entry[0:3] = low
        if high[0] > entry[3]:
            entry[3:6] = high

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
    conn: Connection, job: str, low: int, high: int, max_points: int
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
                Statement(
                    "SELECT step, reduced FROM job_points WHERE job = ? AND step BETWEEN ? AND ?",
                    "SELECT step, reduced FROM job_points WHERE job = %s AND step BETWEEN %s AND "
                    "%s",
                ),
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
            for step, spread in spreads_between(conn, job, first, last).items():
                target = bucket(step)
                for name, entry in spread.items():
                    target.add_spread(
                        name,
                        [entry["min"], entry["min_device"], step],
                        [entry["max"], entry["max_device"], step],
                    )
            continue
        shift = FANOUT_BITS * level
        per_bucket = width >> shift  # blocks per bucket
        base = origin >> shift
        for name, block, lo, lo_dev, lo_step, hi, hi_dev, hi_step in spread_blocks(
            conn, job, level, first, last
        ):
            target = bucket(origin + ((block - base) // per_bucket) * width)
            target.add_spread(name, [lo, lo_dev, lo_step], [hi, hi_dev, hi_step])
        # In primary-key order (metric, then block): no sort; aggregated with numpy, one
        # pass (two GROUP BY queries, for min/max/sum and for the last value, cost ~3x).
        rows = conn.execute(
            Statement(
                "SELECT metric, block, n, total, low, high, last_step, last FROM job_rollups "
                "WHERE job = ? AND level = ? AND block BETWEEN ? AND ?",
                "SELECT metric, block, n, total, low, high, last_step, last FROM job_rollups "
                "WHERE job = %s AND level = %s AND block BETWEEN %s AND %s",
            ),
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


def gauges(conn: Connection, top: int) -> tuple[list[tuple[str, str]], list[tuple]]:
    """Unfinished jobs with their last push (most recent first, ``top + 1`` at most, the
    extra one marking "more"), and pending multi-source steps per job."""
    stale = conn.execute(
        Statement(
            "SELECT job, last_push_at FROM jobs WHERE finished = 0 ORDER BY last_push_at DESC "
            "LIMIT ?",
            "SELECT job, last_push_at FROM jobs WHERE finished = 0 ORDER BY last_push_at DESC "
            "LIMIT %s",
        ),
        (top + 1,),
    ).fetchall()
    oldest_rest = conn.execute(
        Statement(
            "SELECT MIN(last_push_at), COUNT(*) FROM (SELECT last_push_at FROM jobs "
            "WHERE finished = 0 ORDER BY last_push_at DESC LIMIT 9223372036854775807 OFFSET ?) "
            "AS rest",
            "SELECT MIN(last_push_at), COUNT(*) FROM (SELECT last_push_at FROM jobs "
            "WHERE finished = 0 ORDER BY last_push_at DESC LIMIT 9223372036854775807 OFFSET %s) "
            "AS rest",
        ),
        (top,),
    ).fetchone()
    pending = incomplete_jobs(conn)
    return [*stale[:top], *([("", oldest_rest[0])] if oldest_rest[1] else [])], pending


# ------------------------------------------------------------------- what services call


@dataclass(frozen=True)
class HistoryRead:
    """A history read: a page (``entries`` in step order, ``more`` when steps follow) or,
    downsampled, ``buckets`` of ``width`` steps each."""

    entries: list[StoredPoint | PendingStep] = field(default_factory=list)
    more: bool = False
    width: int = 0
    buckets: list[Bucket] | None = None


async def read_history(
    store: Store,
    job: str,
    low: int,
    high: int,
    *,
    limit: int,
    include_partial: bool,
    page_bytes: int | None,
    max_points: int | None,
    buckets_for: Callable[[list[str]], int] | None = None,
) -> HistoryRead:
    """Steps ``[low, high]`` of a job: downsampled when ``max_points`` is given and the
    job holds more complete points than that in its stored range, else a page.

    Args:
      low, high: the steps asked for.
      limit, include_partial, page_bytes: the page's bounds (:func:`history_page`).
      max_points: the most buckets of a downsampled read.
      buckets_for: the buckets an answer naming these metrics may hold (sizing the read
        before it runs); None: ``max_points``.
    """

    def read(conn: Connection) -> HistoryRead:
        info = get_job(conn, job)
        lo, hi = low, high
        if info is not None and info.first_step is not None:
            lo, hi = max(lo, info.first_step), min(hi, info.last_step or 0)
        if (
            max_points is not None
            and lo <= hi
            and hi - lo + 1 > max_points
            and count_points(conn, job, lo, hi, max_points + 1) > max_points
        ):
            count = max_points
            if buckets_for is not None:
                count = buckets_for(metric_names(conn, job, lo, hi))
            width, buckets = downsample(conn, job, lo, hi, count)
            return HistoryRead(width=width, buckets=buckets)
        entries, more = history_page(conn, job, low, high, limit, include_partial, page_bytes)
        return HistoryRead(entries=entries, more=more)

    return await store.read(read)


async def read_jobs(store: Store, limit: int, offset: int) -> tuple[list[JobRow], int]:
    """Jobs, most recently pushed first, and the total (:func:`list_jobs`)."""
    return await store.read(lambda c: list_jobs(c, limit, offset))


async def read_job(store: Store, job: str) -> JobRow | None:
    """One job's row (:func:`get_job`), or None."""
    return await store.read(lambda c: get_job(c, job))


async def read_gauges(store: Store, top: int) -> tuple[list[tuple[str, str]], list[tuple]]:
    """The rows of the job gauges (:func:`gauges`)."""
    return await store.read(lambda c: gauges(c, top))
