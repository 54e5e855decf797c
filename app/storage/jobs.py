"""The job tables' writes: metric points, multi-source parts, the jobs list.

The services call the typed async functions at the end (:func:`store_points`,
:func:`store_batch_here`, :func:`mark_finished`, :func:`remove_job`,
:func:`expire_pushed_before`); they run the plain functions over an open
``Connection`` above them inside :class:`app.storage.db.Store`'s transactions
(writes inside ``BEGIN IMMEDIATE``, so SQLite's write lock serialises every
read-check-write below: no two pushes can interleave, in this process or another one on
the same file). Reads are :mod:`app.storage.history`; rollups :mod:`app.storage.rollups`;
the stored text of reduced points :mod:`app.storage.reduced_text`.

Tables (schema version 4; their schemas and migrations are in :mod:`app.storage.migrations`):

- ``job_points (job, step)``: one row per *complete* step: the reduced values as the JSON
  text the API answers, ``digest`` of what was pushed (idempotency), ``sources``.
- ``job_segments``: multi-source parts (``sources`` > 1), one row per source and push,
  merged into ``job_points`` as steps complete (:mod:`app.storage.parts`).
- ``job_rollups``: per scalar metric and block of steps (:mod:`app.storage.rollups`).
- ``jobs (job)``: points, first and last step, ``last_push_at``, ``finished``.

Bounds: a batch is at most 1,000 points (checked by the service).

``downsample``, ``get_job``, ``history_page``, ``scalar_values`` and ``_rollup_rows`` are
imported here as well: the store's tests and ``benchmarks/jobs.py`` reach them so.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from app.core.errors import PartMismatch, SourcesMismatch, StepConflict
from app.core.ids import utc_now
from app.storage.history import downsample, get_job, history_page  # noqa: F401
from app.storage.part_blobs import decode_part
from app.storage.parts import (
    PartSegment,
    SegmentRules,
    missing_sources,
    open_sources,
    push_segment,
    step_sources,
)
from app.storage.rollups import (
    ROLLUP_UPSERT,
    columns_rollup_rows,
    scalar_values,  # noqa: F401
    write_rollups,
)
from app.storage.rollups import rollup_rows as _rollup_rows  # noqa: F401
from app.storage.spreads import (
    SpreadColumn,
    SpreadOf,
    decode_row,
    write_spread_columns,
    write_spreads,
)
from app.storage.store import ArrayInsert, Connection, Statement

if TYPE_CHECKING:
    from app.storage.store import Store

_IN_CHUNK = 500  # variables per IN (...) list, far below SQLite's limit


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
    spread: dict[str, dict[str, Any]] | None = None  # over devices (app.storage.spreads)
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
    conn: Connection, sql: Statement, job: str, steps: Sequence[int]
) -> list[tuple[Any, ...]]:
    """``sql`` (its ``{where}`` the steps' condition, in each engine's text) at ``steps``."""
    rows: list[tuple[Any, ...]] = []
    if not steps:
        return rows
    low, high = min(steps), max(steps)
    if high - low < 2 * len(steps) + 64:
        # Mostly consecutive steps (the usual batch): one range seek.
        between = Statement(
            sql.sqlite.format(where="step BETWEEN ? AND ?"),
            sql.postgres.format(where="step BETWEEN %s AND %s"),
        )
        return conn.execute(between, (job, low, high)).fetchall()
    for chunk in _chunks(sorted(set(steps))):
        listed = Statement(
            sql.sqlite.format(where=f"step IN ({','.join(['?'] * len(chunk))})"),
            sql.postgres.format(where=f"step IN ({','.join(['%s'] * len(chunk))})"),
        )
        rows += conn.execute(listed, (job, *chunk)).fetchall()
    return rows


MISSING_NAMED_UP_TO = 16
"""Pushes of at most this many items learn the names of the sources still missing
(``PushItem.missing``, in single-push answers); larger batches count them only."""


def _where(index: int, item: PushItem) -> str:
    return f"points[{index}] (step {item.step}, source {item.source!r})"


_NEW_POINTS = Statement(
    "INSERT INTO job_points (job, step, reduced, received_at, digest, sources, num_devices) "
    "VALUES (?, ?, ?, ?, ?, 1, ?)",
    "INSERT INTO job_points (job, step, reduced, received_at, digest, sources, num_devices) "
    "VALUES (%s, %s, %s, %s, %s, 1, %s)",
    ArrayInsert(
        "INSERT INTO job_points (job, step, reduced, received_at, digest, sources, num_devices) "
        "SELECT u.c0, u.c1, u.c2, u.c3, u.c4, 1, u.c5 FROM unnest(%b::text[], %b::bigint[], "
        "%b::text[], %b::text[], %b::text[], %b::bigint[]) AS u(c0, c1, c2, c3, c4, c5)",
        ("text", "bigint", "text", "text", "text", "bigint"),
    ),
)
"""New points of one source each (their ``sources`` is 1)."""
_COMPLETED_POINTS = Statement(
    "INSERT INTO job_points (job, step, reduced, received_at, digest, sources, num_devices) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)",
    "INSERT INTO job_points (job, step, reduced, received_at, digest, sources, num_devices) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s)",
    ArrayInsert(
        "INSERT INTO job_points (job, step, reduced, received_at, digest, sources, num_devices) "
        "SELECT u.c0, u.c1, u.c2, u.c3, u.c4, u.c5, u.c6 FROM unnest(%b::text[], %b::bigint[], "
        "%b::text[], %b::text[], %b::text[], %b::bigint[], %b::bigint[]) "
        "AS u(c0, c1, c2, c3, c4, c5, c6)",
        ("text", "bigint", "text", "text", "text", "bigint", "bigint"),
    ),
)
"""Points that parts of several sources completed."""


def _stored_points(conn: Connection, job: str, steps: Sequence[int]) -> dict[int, tuple[Any, ...]]:
    """``step -> (step, digest, sources, reduced, received_at)`` of the stored points."""
    return {
        row[0]: row
        for row in _select_in(
            conn,
            Statement(
                "SELECT step, digest, sources, reduced, received_at FROM job_points "
                "WHERE job = ? AND {where}",
                "SELECT step, digest, sources, reduced, received_at FROM job_points "
                "WHERE job = %s AND {where}",
            ),
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
    conn: Connection,
    job: str,
    items: list[PushItem],
    now: str,
    rules: SegmentRules | None = None,
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

    ``rules``: the jobs service's merge rules, run on each source's parts
    (:data:`app.storage.parts.SegmentRules`; required when the push holds parts:
    storage never imports the service).
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
            _NEW_POINTS,
            [(job, i.step, i.reduced, now, i.digest, i.num_devices) for i in new_points.values()],
        )
    rollup = [(i.step, i.values) for i in new_points.values()]
    spreads = [(i.step, i.spread) for i in new_points.values() if i.spread]
    for i in new_points.values():  # a part of the same step in this push must see it
        stored[i.step] = (i.step, i.digest, 1, i.reduced, now)
    parts = [(i, item) for i, item in enumerate(items) if item.sources > 1]
    completed = 0
    wrote_parts = False
    for segment, members in _segments_of(parts):
        done, done_rollup, done_spreads = push_segments(conn, job, [segment], now, rules, stored)
        completed += done
        rollup += done_rollup
        spreads += done_spreads
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
    write_spreads(conn, job, spreads)
    if new_points or wrote_parts:
        added = [step for step, _ in rollup]
        low, high = min(added, default=None), max(added, default=None)
        _count_points(conn, job, now, len(added), low, high)
    return completed


def push_segments(
    conn: Connection,
    job: str,
    segments: Sequence[PartSegment],
    now: str,
    rules: SegmentRules | None = None,
    stored: dict[int, tuple[Any, ...]] | None = None,
) -> tuple[int, list[tuple[int, dict[str, float]]], list[SpreadOf]]:
    """Stores segments of parts (the jobs service's ``rules``, run by
    :func:`app.storage.parts.push_segment`) and writes the steps they complete into
    ``job_points``; returns the count completed, their rollup input and their spreads
    (the caller writes the rollups, the spreads and the job row).

    Raises:
      ValueError: no ``rules`` were given.
    """
    if rules is None:
        raise ValueError(
            "parts need the jobs service's merge rules "
            "(app.services.jobs.parts.PART_RULES); storage has none of its own"
        )
    completed = 0
    rollup: list[tuple[int, dict[str, float]]] = []
    spreads: list[SpreadOf] = []
    for segment in segments:
        rows = stored if stored is not None else _stored_points(conn, job, segment.steps)
        mine = set(segment.steps)
        points = {step: (int(row[2]), row[3], row[4]) for step, row in rows.items() if step in mine}
        result = push_segment(conn, job, segment, now, rules, points)
        point_rows = [
            (job, step, point.reduced, now, None, segment.sources, point.num_devices)
            for step, point in result.completed
        ]
        if point_rows:
            conn.executemany(
                _COMPLETED_POINTS,
                point_rows,
            )
            if stored is not None:
                for row in point_rows:
                    stored[row[1]] = (row[1], None, row[5], row[2], row[3])
        completed += len(result.completed)
        rollup += [(step, point.values) for step, point in result.completed]
        spreads += [(step, point.spread) for step, point in result.completed if point.spread]
    return completed, rollup, spreads


def push_part_columns(
    conn: Connection,
    job: str,
    segment: PartSegment,
    now: str,
    rules: SegmentRules | None = None,
) -> tuple[int, int]:
    """One source's parts of a batch, stored as one segment (all or nothing; call inside a
    transaction); returns (parts newly stored, steps completed)."""
    completed, rollup, spreads = push_segments(conn, job, [segment], now, rules)
    created = segment.created
    write_rollups(conn, job, rollup)
    write_spreads(conn, job, spreads)
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
    # the steps' spread over devices (app.storage.spreads): each step's stored row (None:
    # none) and per metric its columns
    spread_rows: list[bytes | None] | None = None
    spread_columns: dict[str, SpreadColumn] | None = None

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
                spread=spread,
            )
            for step, digest, text, row, spread in zip(
                self.steps,
                self.digests,
                self.reduced,
                rows,
                [decode_row(r) if r else None for r in self.spread_rows]
                if self.spread_rows
                else [None] * len(self.steps),
                strict=True,
            )
        ]


def _any_in(conn: Connection, table: str, job: str, steps: Sequence[int]) -> bool:
    """Whether ``table`` holds a row of ``job`` at any of ``steps`` (one range seek for
    mostly consecutive steps)."""
    low, high = min(steps), max(steps)
    if high - low < 2 * len(steps) + 64:
        sql = Statement(
            f"SELECT 1 FROM {table} WHERE job = ? AND step BETWEEN ? AND ? LIMIT 1",
            f"SELECT 1 FROM {table} WHERE job = %s AND step BETWEEN %s AND %s LIMIT 1",
        )
        return conn.execute(sql, (job, low, high)).fetchone() is not None
    listed = Statement(
        f"SELECT step FROM {table} WHERE job = ? AND {{where}}",
        f"SELECT step FROM {table} WHERE job = %s AND {{where}}",
    )
    return bool(_select_in(conn, listed, job, steps))


def push_columns(
    conn: Connection,
    job: str,
    batch: PointColumns,
    now: str,
    rules: SegmentRules | None = None,
    rollup_rows: list[tuple] | None = None,
) -> tuple[int, list[PushItem] | None]:
    """Stores a batch of complete steps, all or nothing (call inside a transaction);
    returns how many steps were new and, when the batch took :func:`push`'s path, its items.

    The usual batch (new steps, each once) is written straight from the columns: one
    range seek in ``job_points`` and one in the open segments prove no step is stored or
    pending, then the rows, the rollups and the job row. Any other batch (a retry, a
    repeated step, a clash with a multi-source step) is exactly :func:`push` of
    :meth:`PointColumns.items`, with its errors. ``rollup_rows``: the batch's
    :func:`app.storage.rollups.columns_rollup_rows`, when the caller computed them
    outside the transaction.
    """
    steps = batch.steps
    if (
        not steps
        or len(set(steps)) != len(steps)
        or _any_in(conn, "job_points", job, steps)
        or open_sources(conn, job, steps)
    ):
        items = batch.items()
        push(conn, job, items, now, rules)
        return sum(1 for item in items if item.created), items
    count = len(steps)
    conn.executemany(
        _NEW_POINTS,
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
        rollup_rows = columns_rollup_rows(job, batch.steps, batch.values)
    conn.executemany(ROLLUP_UPSERT, rollup_rows)
    if batch.spread_rows and batch.spread_columns:
        write_spread_columns(conn, job, steps, batch.spread_columns, batch.spread_rows)
    _count_points(conn, job, now, count, min(steps), max(steps))
    return count, None


def _count_points(
    conn: Connection, job: str, now: str, added: int, low: int | None, high: int | None
) -> None:
    """The job row: created on its first push, then its point count, step range and last
    push time."""
    conn.execute(_COUNT_POINTS, (job, now, now, added, low, high))


_COUNT_POINTS = Statement(
    "INSERT INTO jobs (job, created_at, last_push_at, points, first_step, last_step) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (job) DO UPDATE SET "
    "last_push_at = excluded.last_push_at, points = jobs.points + excluded.points, "
    "first_step = coalesce(min(jobs.first_step, excluded.first_step), jobs.first_step, "
    "excluded.first_step), "
    "last_step = coalesce(max(jobs.last_step, excluded.last_step), jobs.last_step, "
    "excluded.last_step)",
    # PostgreSQL's scalar extremes are least/greatest (which skip a NULL: the coalesce
    # then means the same in both)
    "INSERT INTO jobs (job, created_at, last_push_at, points, first_step, last_step) "
    "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (job) DO UPDATE SET "
    "last_push_at = excluded.last_push_at, points = jobs.points + excluded.points, "
    "first_step = coalesce(least(jobs.first_step, excluded.first_step), jobs.first_step, "
    "excluded.first_step), "
    "last_step = coalesce(greatest(jobs.last_step, excluded.last_step), jobs.last_step, "
    "excluded.last_step)",
)


def delete_job(conn: Connection, job: str) -> bool:
    """Deletes a job and all its rows; False when there was no such job."""
    found = False
    for table in ("jobs", *_HISTORY_KEYS, "job_links"):
        sql = Statement(f"DELETE FROM {table} WHERE job = ?", f"DELETE FROM {table} WHERE job = %s")
        found = conn.execute(sql, (job,)).rowcount > 0 or found
    return found


_HISTORY_KEYS = {
    "job_points": "step",
    "job_segments": "id",
    "job_coverage": "chunk",
    "job_rollups": "level, metric, block",
    "job_spreads": "step",
    "job_spread_blocks": "level, metric, block",
}
"""A job's history tables (what :func:`delete_job_piece` removes), each with the columns
that name one of its rows within the job."""


def delete_job_piece(conn: Connection, job: str, rows: int) -> int:
    """Deletes at most ``rows`` rows of each of the job's history tables, its points'
    lowest steps first (not its ``jobs`` row or link: :func:`delete_job` removes those with
    the rest); answers how many. A job deleted in pieces on a full disk
    (:meth:`app.storage.db.Store.delete`)."""
    removed = 0
    for table, key in _HISTORY_KEYS.items():
        removed += conn.execute(
            Statement(
                f"DELETE FROM {table} WHERE job = ? AND ({key}) IN "
                f"(SELECT {key} FROM {table} WHERE job = ? ORDER BY {key} LIMIT ?)",
                f"DELETE FROM {table} WHERE job = %s AND ({key}) IN "
                f"(SELECT {key} FROM {table} WHERE job = %s ORDER BY {key} LIMIT %s)",
            ),
            (job, job, rows),
        ).rowcount
    return removed


def set_finished(conn: Connection, job: str, finished: bool) -> bool:
    sql = Statement(
        "UPDATE jobs SET finished = ? WHERE job = ?", "UPDATE jobs SET finished = %s WHERE job = %s"
    )
    return conn.execute(sql, (int(finished), job)).rowcount > 0


def expire_jobs(conn: Connection, pushed_before: str, limit: int = 100) -> list[str]:
    """Deletes up to ``limit`` jobs whose last push is older than ``pushed_before``."""
    sql = Statement(
        "SELECT job FROM jobs WHERE last_push_at < ? ORDER BY last_push_at LIMIT ?",
        "SELECT job FROM jobs WHERE last_push_at < %s ORDER BY last_push_at LIMIT %s",
    )
    jobs = [row[0] for row in conn.execute(sql, (pushed_before, limit))]
    for job in jobs:
        delete_job(conn, job)
    return jobs


# ------------------------------------------------------------------- what services call


@dataclass
class PushBatch:
    """The rows of one push, in the form its decoding allowed (exactly one is given):

    - ``items``: points and parts one by one (a single push, or any batch);
    - ``columns``: a batch of new complete steps as columns (no object per point);
    - ``parts``: one source's parts of a batch, as one segment.
    """

    items: list[PushItem] = field(default_factory=list)
    columns: PointColumns | None = None
    parts: PartSegment | None = None


@dataclass(frozen=True)
class PushOutcome:
    """What a push stored: points in it, how many were new, steps it completed, when it
    was received (its first point's time: a retry's is the stored one), and the items
    with their outcome (empty when the push took the columnar path untouched)."""

    points: int
    created: int
    completed: int
    received_at: str
    items: list[PushItem] = field(default_factory=list)


def _outcome_of_items(items: list[PushItem], now: str) -> PushOutcome:
    return PushOutcome(
        points=len(items),
        created=sum(1 for i in items if i.created),
        completed=len({i.step for i in items if i.created and i.complete}),
        received_at=items[0].received_at if items else now,
        items=items,
    )


def store_batch_here(
    store: Store, job: str, batch: PushBatch, rules: SegmentRules | None = None
) -> PushOutcome:
    """Stores a push, all or nothing, in the store's group commit; for a caller already in
    a worker thread (it blocks until the durable commit). ``rules``: the jobs service's
    merge rules, for parts (as :func:`push`).

    Raises:
      StepConflict, SourcesMismatch, PartMismatch: as :func:`push`.
    """
    now = utc_now()
    write = functools.partial(store.write_grouped_here, key=f"job:{job}")
    if batch.parts is not None:
        segment = batch.parts
        created, completed = write(lambda c: push_part_columns(c, job, segment, now, rules))
        first = segment.outcome(segment.steps[0])[2] if segment.steps else now
        return PushOutcome(len(segment.steps), created, completed, first)
    if batch.columns is not None:
        columns = batch.columns
        # Computed before the write: the group commit's lock then covers SQLite's work only,
        # and a pusher's next batch is decoded while this one commits.
        rollup = columns_rollup_rows(job, columns.steps, columns.values)
        created, items = write(lambda c: push_columns(c, job, columns, now, rules, rollup))
        if items is None:  # every step new and complete
            return PushOutcome(len(columns), created, created, now)
        return _outcome_of_items(items, now)
    items = batch.items
    write(lambda c: push(c, job, items, now, rules))
    return _outcome_of_items(items, now)


async def store_points(
    store: Store, job: str, items: list[PushItem], rules: SegmentRules | None = None
) -> PushOutcome:
    """Stores points and parts one by one (:func:`push`, with the jobs service's merge
    ``rules`` for parts), all or nothing, in the store's group commit (pushes waiting at
    the same time share one fsync). Sets each item's outcome fields."""
    await store.write_grouped(lambda c: push(c, job, items, utc_now(), rules), key=f"job:{job}")
    return _outcome_of_items(items, items[0].received_at if items else "")


async def mark_finished(store: Store, job: str, finished: bool) -> bool:
    """Sets the job's ``finished``; False when there is no such job."""
    return await store.write(lambda c: set_finished(c, job, finished))


async def remove_job(store: Store, job: str) -> bool:
    """Deletes the job and all its rows durably; False when there was no such job. Works on
    a full disk, a big job in pieces (:meth:`Store.delete`)."""
    return await store.delete(
        lambda c: delete_job(c, job), piece=lambda c, rows: delete_job_piece(c, job, rows)
    )


async def expire_pushed_before(store: Store, stamp: str) -> list[str]:
    """Deletes up to 100 jobs last pushed before ``stamp`` (RFC 3339 UTC); their names."""
    return await store.write(lambda c: expire_jobs(c, stamp))


__all__ = [
    "ROLLUP_UPSERT",
    "PointColumns",
    "PushBatch",
    "PushItem",
    "PushOutcome",
    "expire_pushed_before",
    "mark_finished",
    "push",
    "push_columns",
    "push_part_columns",
    "remove_job",
    "store_batch_here",
    "store_points",
]
