"""Multi-source parts, stored one row per source and push ("segment"), merged per step.

A job whose hosts each push their own devices' metrics (``sources > 1``) sends, per host
and batch, the parts of many steps. They are stored as they come: one ``job_segments``
row holds one source's parts of a batch, stacked (each metric ``[P, n_devices, ...]``,
:mod:`app.storage.part_blobs`), with its steps and a 64-bit content hash per step. Nothing is
written per part: 64 hosts pushing 1,000 steps each write 64 rows, not 64,000.

A step is complete once ``sources`` distinct sources hold it; the push that brings its
last part merges it (every source's rows for the completed steps, concatenated along the
device axis in natural source order, reduced as one push of every device) into
``job_points``, and counts it down in each segment's ``pending``. Those rules (retries,
conflicts, coverage counts, the merge) are the jobs service's
(:mod:`app.services.jobs.parts`): storage runs them inside the push's transaction
(:func:`push_segment`, :data:`SegmentRules`) and hands them the job's segments as a
:class:`SegmentTable`, typed reads and writes; this module keeps the SQL and the row
codecs. A segment whose steps are
all complete drops its arrays (``NULL``); its steps and hashes stay, so a retried part is
still recognised.

Table (schema version 4; :func:`app.storage.migrations.migrate_to_v4` turns version 3's
``job_parts`` and ``job_pending`` into segments, one per stored part, and drops them):

- ``job_segments``: ``job, source, first_step, last_step, sources, signature,
  num_devices, steps`` (int64 ``[P]``, ascending), ``hashes`` (uint64 ``[P]``; 0: unknown,
  a part migrated without its arrays), ``arrays`` (or NULL), ``pending`` (its steps not
  yet complete), ``received_at``. A source's segments never share a step. Indexed by
  ``(job, source, last_step)`` (retries), ``(job, last_step)`` (who holds a step) and,
  for open segments only, ``(job, first_step)``: a push reads the open segments' metadata
  around its steps, whose number the stragglers bound, never the job's history.
- ``job_coverage (job, chunk)``: per block of 4,096 steps, how many sources hold each
  step (uint16). A push adds itself to the blocks of its own steps and learns which of
  them are now complete: its cost grows with its own steps, not with the number of hosts
  (no host reads every other host's steps to count). A block is stored dense (4,096
  counts, 8 KiB) only when that is smaller than sparse ``(offset, count)`` pairs (4 bytes
  per step held): steps pushed 4,096 apart cost 4 bytes each, not 8 KiB each, so coverage
  grows with the steps pushed, never with the span between them
  (:func:`encode_coverage`). Dense blocks written before this encoding read unchanged.

Bounds: a push reads the metadata of the open segments overlapping its steps, the
coverage blocks of its steps (8 KiB each) and, when it completes steps, the steps and
arrays of the segments holding them (at most ``sources`` of them per step); finding a
job's incomplete steps reads its open segments' steps and the coverage blocks they touch,
never ``job_points``. Open segments are what waits on stragglers: their number and size
are the pushes not yet merged.

Every write runs inside the caller's ``BEGIN IMMEDIATE`` transaction: SQLite's write lock
serialises pushes, so two hosts completing the same step cannot both merge it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from app.storage.part_blobs import decode_part, encode_part
from app.storage.store import ArrayInsert, Connection, Statement

WEIGHTS_ARRAY = "_weights"
"""A part's weights, stored beside its metrics (``[n_devices]``; stacked ``[P, n_devices]``)."""

COVERAGE_BITS = 12
"""``job_coverage`` counts, per block of 4,096 steps, how many sources hold each step
(uint16 each, 8 KiB a block): a push reads and adds to the blocks of its own steps, never
the other sources' segments."""


_DENSE_BYTES = 2 << COVERAGE_BITS
"""Bytes of a dense coverage block: one uint16 count per step of the block."""


def encode_coverage(counts: np.ndarray) -> bytes:
    """One coverage block (``[4096]`` uint16 counts) as stored: sparse ``(offset, count)``
    uint16 pairs, ascending, when fewer than 2,048 steps of the block are held (the blob
    is then shorter than 8 KiB), else the dense counts (exactly 8 KiB). The length tells
    the two apart."""
    held = np.flatnonzero(counts)
    if held.size * 4 < _DENSE_BYTES:
        pairs = np.empty((held.size, 2), dtype="<u2")
        pairs[:, 0] = held
        pairs[:, 1] = counts[held]
        return pairs.tobytes()
    return np.asarray(counts, dtype="<u2").tobytes()


def decode_coverage(blob: bytes) -> np.ndarray:
    """A stored coverage block -> ``[4096]`` uint16 counts (writable)."""
    if len(blob) == _DENSE_BYTES:
        return np.frombuffer(blob, dtype="<u2").copy()
    pairs = np.frombuffer(blob, dtype="<u2").reshape(-1, 2)
    counts = np.zeros(1 << COVERAGE_BITS, dtype="<u2")
    counts[pairs[:, 0]] = pairs[:, 1]
    return counts


_IN_CHUNK = 500
"""Most ``?`` of one ``IN (...)`` list (SQLite allows 32,766)."""


class MergedStep(NamedTuple):
    """A completed step's merge: reduced JSON text, scalars, device count. (A tuple: a
    merge makes one per completed step.)"""

    reduced: str
    values: dict[str, float]
    num_devices: int
    spread: dict[str, Any] | None = None  # over the merged devices (app.storage.spreads)


@dataclass
class PartSegment:
    """One source's parts of one or more steps, as the service decoded them: every
    metric stacked ``[P, n_devices, ...]`` (``_weights`` ``[P, n_devices]``), in push
    order; ``positions`` are the parts' places in the push (for error messages)."""

    source: str
    sources: int
    signature: str
    num_devices: int
    steps: list[int]
    columns: dict[str, np.ndarray]
    positions: list[int] = field(default_factory=list)
    # filled in by push_segment from the rules' SegmentPush: how many parts were new,
    # and for the steps that are complete (stored before, or completed by this push)
    # their reduced text and time
    created: int = 0
    created_steps: set[int] = field(default_factory=set)
    complete: dict[int, tuple[str, str]] = field(default_factory=dict)
    received_at: str = ""

    def outcome(self, step: int) -> tuple[bool, str | None, str]:
        """(created, reduced text or None, received_at) of one of the segment's steps."""
        done = self.complete.get(step)
        return (
            step in self.created_steps,
            None if done is None else done[0],
            self.received_at if done is None else done[1],
        )

    def record(self, result: SegmentPush) -> None:
        """Takes the outcome fields from what the merge rules did."""
        self.created = len(result.created_steps)
        self.created_steps = set(result.created_steps)
        self.complete = dict(result.complete)
        self.received_at = result.received_at

    def where(self, step: int) -> str:
        """Where a step's part sits in the push, for error messages."""
        index = self.steps.index(step)
        place = self.positions[index] if index < len(self.positions) else index
        return f"points[{place}] (step {step}, source {self.source!r})"


def source_order(source: str) -> tuple[Any, ...]:
    """Natural order of source names: ``host-2`` before ``host-10``."""
    parts: list[Any] = []
    number = ""
    text = ""
    for char in source:
        if char.isdigit():
            if text:
                parts.append((1, text))
                text = ""
            number += char
        else:
            if number:
                parts.append((0, int(number)))
                number = ""
            text += char
    if number:
        parts.append((0, int(number)))
    if text:
        parts.append((1, text))
    return tuple(parts)


def missing_sources(received: Iterable[str], sources: int) -> list[str] | None:
    """The names of the sources not yet received, when the names tell them: every
    received name is one common prefix plus a canonical decimal index below ``sources``
    (``"0"``.., ``"host-0"``..; no leading zeros, so ``h0`` and ``h00`` are not both
    index 0), each index once. Otherwise None (only the count is known). Whenever a list
    is returned, its length is ``sources`` minus the number of names received."""
    prefix = None
    seen: set[int] = set()
    count = 0
    for name in received:
        count += 1
        digits = len(name) - len(name.rstrip("0123456789"))
        if digits == 0:
            return None
        head, text = name[: len(name) - digits], name[len(name) - digits :]
        index = int(text)
        if text != str(index) or index in seen:  # "007", "00": not the index's own name
            return None
        if (prefix is not None and head != prefix) or index >= sources:
            return None
        prefix = head
        seen.add(index)
    if prefix is None:
        return None
    missing = [f"{prefix}{i}" for i in range(sources) if i not in seen]
    return missing if len(missing) == sources - count else None


def _steps_of(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype="<i8")


def step_sources(conn: Connection, job: str, step: int) -> list[str]:
    """The sources holding a part of ``step``, in natural order."""
    names = [
        source
        for source, steps in conn.execute(
            Statement(
                "SELECT source, steps FROM job_segments WHERE job = ? AND last_step >= ? "
                "AND first_step <= ?",
                "SELECT source, steps FROM job_segments WHERE job = %s AND last_step >= %s "
                "AND first_step <= %s",
            ),
            (job, step, step),
        )
        if np.isin(step, _steps_of(steps))
    ]
    return sorted(names, key=source_order)


def open_sources(conn: Connection, job: str, steps: Sequence[int]) -> dict[int, int]:
    """``step -> sources`` of the given steps that an open segment holds (parts waiting
    for their step to complete, or parts of its completed steps)."""
    if not len(steps):
        return {}
    wanted = np.unique(np.asarray(steps, dtype=np.int64))
    out: dict[int, int] = {}
    for blob, sources in conn.execute(
        Statement(
            "SELECT steps, sources FROM job_segments WHERE job = ? AND pending > 0 "
            "AND first_step <= ? AND last_step >= ?",
            "SELECT steps, sources FROM job_segments WHERE job = %s AND pending > 0 "
            "AND first_step <= %s AND last_step >= %s",
        ),
        (job, int(wanted[-1]), int(wanted[0])),
    ):
        for step in np.intersect1d(wanted, _steps_of(blob), assume_unique=True).tolist():
            out[step] = int(sources)
    return out


def _segment_steps_blob(conn: Connection, seg_id: int) -> bytes:
    return conn.execute(
        Statement(
            "SELECT steps FROM job_segments WHERE id = ?",
            "SELECT steps FROM job_segments WHERE id = %s",
        ),
        (seg_id,),
    ).fetchone()[0]


def _coverage_block(conn: Connection, job: str, chunk: int) -> np.ndarray:
    """One ``job_coverage`` block (read-only; zeros where none is stored yet)."""
    found = conn.execute(
        Statement(
            "SELECT counts FROM job_coverage WHERE job = ? AND chunk = ?",
            "SELECT counts FROM job_coverage WHERE job = %s AND chunk = %s",
        ),
        (job, chunk),
    ).fetchone()
    if found is None:
        return np.zeros(1 << COVERAGE_BITS, dtype="<u2")
    return decode_coverage(bytes(found[0]))


def _add_coverage(conn: Connection, job: str, steps: np.ndarray) -> np.ndarray:
    """Adds one source to each of ``steps`` (new to it, ascending) in ``job_coverage``;
    returns how many sources hold each step now."""
    chunks = steps >> COVERAGE_BITS
    out = np.empty(steps.size, dtype=np.int64)
    starts = np.flatnonzero(np.diff(chunks, prepend=-1))
    ends = np.append(starts[1:], steps.size)
    rows = []
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        chunk = int(chunks[start])
        counts = _coverage_block(conn, job, chunk)
        at = steps[start:end] - (chunk << COVERAGE_BITS)
        counts[at] += 1  # the steps are unique
        out[start:end] = counts[at]
        rows.append((job, chunk, encode_coverage(counts)))
    conn.executemany(
        Statement(
            "INSERT INTO job_coverage (job, chunk, counts) VALUES (?, ?, ?) "
            "ON CONFLICT (job, chunk) DO UPDATE SET counts = excluded.counts",
            "INSERT INTO job_coverage (job, chunk, counts) VALUES (%s, %s, %s) "
            "ON CONFLICT (job, chunk) DO UPDATE SET counts = excluded.counts",
            ArrayInsert(
                "INSERT INTO job_coverage (job, chunk, counts) SELECT u.c0, u.c1, u.c2 FROM "
                "unnest(%b::text[], %b::bigint[], %b::bytea[]) AS u(c0, c1, c2) ON CONFLICT "
                "(job, chunk) DO UPDATE SET counts = excluded.counts",
                ("text", "bigint", "bytea"),
                (0, 1),
            ),
        ),
        rows,
    )
    return out


@dataclass(frozen=True)
class SegmentPush:
    """What the merge rules made of one segment (:data:`SegmentRules`).

    Attributes:
      received_at: the push's time.
      complete: ``step -> (reduced text, received_at)`` of the segment's steps that are
        complete: stored before, or completed by this push.
      created_steps: the steps whose parts this push newly stored.
      completed: ``(step, merged point)`` of each step this push completed, for
        ``job_points`` and the rollups.
    """

    received_at: str
    complete: dict[int, tuple[str, str]] = field(default_factory=dict)
    created_steps: frozenset[int] = frozenset()
    completed: tuple[tuple[int, MergedStep], ...] = ()


class OwnSegment(NamedTuple):
    """A stored segment of the pushing source: its steps (ascending) and their hashes."""

    steps: np.ndarray
    hashes: np.ndarray
    signature: str
    sources: int


class OtherSegment(NamedTuple):
    """An open segment of another source whose sources, signature or devices differ."""

    steps: np.ndarray
    sources: int
    signature: str
    num_devices: int


class OpenHolder(NamedTuple):
    """An open segment of another source: row id, source, steps (ascending)."""

    id: int
    source: str
    steps: np.ndarray


class SegmentTable:
    """``job_segments`` and ``job_coverage`` of one job, as the merge rules
    (:data:`SegmentRules`) read and write them inside a push's transaction: typed reads
    and writes, no connection handed out."""

    def __init__(self, conn: Connection, job: str) -> None:
        self._conn = conn
        self.job = job

    def own_segments(self, source: str, low: int, high: int) -> Iterator[OwnSegment]:
        """``source``'s segments (open or not) overlapping ``[low, high]``."""
        for blob, hash_blob, signature, sources in self._conn.execute(
            Statement(
                "SELECT steps, hashes, signature, sources FROM job_segments "
                "WHERE job = ? AND source = ? AND last_step >= ? AND first_step <= ?",
                "SELECT steps, hashes, signature, sources FROM job_segments "
                "WHERE job = %s AND source = %s AND last_step >= %s AND first_step <= %s",
            ),
            (self.job, source, low, high),
        ):
            yield OwnSegment(
                _steps_of(blob), np.frombuffer(hash_blob, dtype="<u8"), signature, sources
            )

    def disagreeing_segments(
        self, segment: PartSegment, low: int, high: int
    ) -> Iterator[OtherSegment]:
        """Other sources' open segments overlapping ``[low, high]`` whose ``sources``,
        signature or device count differ from ``segment``'s."""
        for blob, sources, signature, num_devices in self._conn.execute(
            Statement(
                "SELECT steps, sources, signature, num_devices FROM job_segments "
                "WHERE job = ? AND pending > 0 AND first_step <= ? AND last_step >= ? "
                "AND source != ? AND (sources != ? OR signature != ? OR num_devices != ?)",
                "SELECT steps, sources, signature, num_devices FROM job_segments "
                "WHERE job = %s AND pending > 0 AND first_step <= %s AND last_step >= %s "
                "AND source != %s AND (sources != %s OR signature != %s OR num_devices != %s)",
            ),
            (
                self.job,
                high,
                low,
                segment.source,
                segment.sources,
                segment.signature,
                segment.num_devices,
            ),
        ):
            yield OtherSegment(_steps_of(blob), sources, signature, num_devices)

    def open_holders(self, source: str, low: int, high: int) -> list[OpenHolder]:
        """Other sources' open segments overlapping ``[low, high]``."""
        rows = self._conn.execute(
            Statement(
                "SELECT id, source FROM job_segments "
                "WHERE job = ? AND pending > 0 AND first_step <= ? AND last_step >= ? AND source "
                "!= ?",
                "SELECT id, source FROM job_segments "
                "WHERE job = %s AND pending > 0 AND first_step <= %s AND last_step >= %s AND "
                "source != %s",
            ),
            (self.job, high, low, source),
        ).fetchall()
        return [
            OpenHolder(seg_id, name, _steps_of(_segment_steps_blob(self._conn, seg_id)))
            for seg_id, name in rows
        ]

    def arrays_of(self, ids: Sequence[int]) -> dict[int, dict[str, np.ndarray]]:
        """The stacked arrays of the segments ``ids`` (open ones), read in few queries."""
        wanted = sorted(ids)
        loaded: dict[int, dict[str, np.ndarray]] = {}
        for start in range(0, len(wanted), _IN_CHUNK):
            chunk = wanted[start : start + _IN_CHUNK]
            sql = Statement(
                f"SELECT id, arrays FROM job_segments WHERE id IN ({','.join(['?'] * len(chunk))})",
                f"SELECT id, arrays FROM job_segments WHERE id IN "
                f"({','.join(['%s'] * len(chunk))})",
            )
            for seg_id, blob in self._conn.execute(sql, chunk):
                loaded[seg_id] = decode_part(bytes(blob))
        return loaded

    def step_sources(self, step: int) -> list[str]:
        """The sources holding a part of ``step``, in natural order."""
        return step_sources(self._conn, self.job, step)

    def add_coverage(self, steps: np.ndarray) -> np.ndarray:
        """Adds one source to each of ``steps`` (new to it, ascending) in
        ``job_coverage``; returns how many sources hold each step now."""
        return _add_coverage(self._conn, self.job, steps)

    def insert_segment(
        self,
        segment: PartSegment,
        steps: np.ndarray,
        hashes: np.ndarray,
        columns: dict[str, np.ndarray],
        pending: int,
        now: str,
    ) -> None:
        """One ``job_segments`` row: ``segment``'s new parts of ``steps`` (ascending), with
        their ``hashes`` and arrays (``columns``, ``[len(steps), n_devices, ...]``), of
        which ``pending`` steps are not complete yet (0: the arrays are not kept)."""
        self._conn.execute(
            Statement(
                "INSERT INTO job_segments (job, source, first_step, last_step, sources, signature, "
                "num_devices, steps, hashes, arrays, pending, received_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                "INSERT INTO job_segments (job, source, first_step, last_step, sources, signature, "
                "num_devices, steps, hashes, arrays, pending, received_at) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            ),
            (
                self.job,
                segment.source,
                int(steps[0]),
                int(steps[-1]),
                segment.sources,
                segment.signature,
                segment.num_devices,
                steps.astype("<i8").tobytes(),
                hashes.astype("<u8").tobytes(),
                encode_part(columns) if pending else None,
                pending,
                now,
            ),
        )

    def count_down(self, counts: dict[int, int]) -> None:
        """Counts completed steps down in the segments holding them (``seg_id -> steps``);
        a segment with nothing pending drops its arrays (its steps and hashes stay)."""
        self._conn.executemany(
            Statement(
                "UPDATE job_segments SET pending = pending - ?, "
                "arrays = CASE WHEN pending - ? > 0 THEN arrays END WHERE id = ?",
                "UPDATE job_segments SET pending = pending - %s, "
                "arrays = CASE WHEN pending - %s > 0 THEN arrays END WHERE id = %s",
            ),
            [(n, n, seg_id) for seg_id, n in counts.items()],
        )


SegmentRules = Callable[
    [SegmentTable, PartSegment, str, dict[int, tuple[int, str, str]]], SegmentPush
]
"""The jobs service's merge rules (:class:`app.services.jobs.parts.PartRules`): given the
job's segments, one source's segment, the push's time and ``step -> (sources, reduced,
received_at)`` of its steps already complete, they check the parts, store them through
the table, merge the steps they complete and say what they did. Storage runs them inside
the push's transaction; it never imports the service."""


def push_segment(
    conn: Connection,
    job: str,
    segment: PartSegment,
    now: str,
    rules: SegmentRules,
    stored_points: dict[int, tuple[int, str, str]],
) -> SegmentPush:
    """Runs the merge rules on one source's segment (call inside a transaction) and fills
    ``segment``'s outcome fields. ``stored_points``: ``step -> (sources, reduced,
    received_at)`` of the complete steps among the segment's, read by the caller, who
    also writes the points the result completed.

    Raises:
      ServiceError: the rules' conflicts (``step_conflict``, ``sources_mismatch``,
        ``part_mismatch``) and the library's metric codes.
    """
    # From scratch: a group commit may run a push again after rolling it back.
    segment.created, segment.created_steps, segment.complete = 0, set(), {}
    result = rules(SegmentTable(conn, job), segment, now, stored_points)
    segment.record(result)
    return result


# ------------------------------------------------------------------------------ reads


@dataclass(frozen=True)
class PendingStep:
    """An incomplete step: its parts so far, ``[(source, {name: [n_devices, ...]})]``."""

    step: int
    sources: int
    received_at: str
    parts: list[tuple[str, dict[str, np.ndarray]]]
    signature: str = ""


def _open_segments(
    conn: Connection, job: str, low: int, high: int, with_arrays: bool
) -> list[tuple]:
    arrays = "arrays" if with_arrays else "NULL"
    return conn.execute(
        Statement(
            f"SELECT source, steps, sources, signature, received_at, {arrays} FROM job_segments "
            "WHERE job = ? AND pending > 0 AND first_step <= ? AND last_step >= ?",
            f"SELECT source, steps, sources, signature, received_at, {arrays} FROM job_segments "
            "WHERE job = %s AND pending > 0 AND first_step <= %s AND last_step >= %s",
        ),
        (job, high, low),
    ).fetchall()


def _coverage_of(conn: Connection, job: str, steps: np.ndarray) -> np.ndarray:
    """How many sources hold each of ``steps`` (ascending), from ``job_coverage``: one
    read per 4,096-step block the steps touch."""
    out = np.zeros(steps.size, dtype=np.int64)
    chunks = steps >> COVERAGE_BITS
    for chunk in np.unique(chunks).tolist():
        mask = chunks == chunk
        out[mask] = _coverage_block(conn, job, chunk)[steps[mask] - (chunk << COVERAGE_BITS)]
    return out


def _incomplete(
    conn: Connection, job: str, segments: list[tuple], low: int, high: int
) -> np.ndarray:
    """The steps in ``[low, high]`` that open segments hold and fewer than their
    ``sources`` hold yet (``job_coverage``; never a scan of ``job_points``, which may hold
    every step between an old straggling part and the newest)."""
    held = [_steps_of(row[1]) for row in segments]
    if not held:
        return np.zeros(0, dtype=np.int64)
    steps = np.concatenate(held)
    wanted = np.concatenate(
        [np.full(len(h), int(row[2]), np.int64) for h, row in zip(held, segments, strict=True)]
    )
    inside = (steps >= low) & (steps <= high)
    steps, order = np.unique(steps[inside], return_index=True)
    if not steps.size:
        return steps
    sources = wanted[inside][order]
    return steps[_coverage_of(conn, job, steps) < sources]


def pending_steps(
    conn: Connection,
    job: str,
    low: int,
    high: int,
    limit: int,
    max_bytes: int | None = None,
) -> tuple[list[PendingStep], int | None]:
    """The first ``limit`` incomplete steps in ``[low, high]``, with their parts (the
    arrays of only the segments that hold those steps are read), and the first
    incomplete step left out for ``max_bytes`` (None: none was).

    ``max_bytes`` bounds the stored arrays read: the steps kept are the longest run whose
    segments (every open segment starting at or before the run's last step) hold at most
    that many bytes of arrays, and at least the first step. Incomplete steps keep every
    source's stacked arrays, so without it one read could load every straggler's parts."""
    segments = _open_segments(conn, job, low, high, with_arrays=False)
    steps = _incomplete(conn, job, segments, low, high)[:limit]
    if not steps.size:
        return [], None
    dropped: int | None = None
    if max_bytes is not None:
        sizes = conn.execute(
            Statement(
                "SELECT first_step, coalesce(length(arrays), 0) FROM job_segments "
                "WHERE job = ? AND pending > 0 AND first_step <= ? AND last_step >= ? "
                "ORDER BY first_step",
                "SELECT first_step, coalesce(length(arrays), 0) FROM job_segments "
                "WHERE job = %s AND pending > 0 AND first_step <= %s AND last_step >= %s "
                "ORDER BY first_step",
            ),
            (job, int(steps[-1]), int(steps[0])),
        ).fetchall()
        starts = np.asarray([row[0] for row in sizes], dtype=np.int64)
        held = np.cumsum(np.asarray([row[1] for row in sizes], dtype=np.int64))
        # Bytes to read to show the steps up to each step: segments starting at or before it.
        need = held[np.searchsorted(starts, steps, side="right") - 1]
        keep = max(1, int(np.searchsorted(need, max_bytes, side="right")))
        if keep < steps.size:
            dropped = int(steps[keep])
            steps = steps[:keep]
    low, high = int(steps[0]), int(steps[-1])
    segments = _open_segments(conn, job, low, high, with_arrays=True)
    by_step: dict[int, list[tuple[str, dict[str, np.ndarray]]]] = {s: [] for s in steps.tolist()}
    info: dict[int, tuple[int, str, str]] = {}
    for source, blob, sources, signature, received_at, arrays in segments:
        common, _, theirs = np.intersect1d(
            steps, _steps_of(blob), assume_unique=True, return_indices=True
        )
        if not common.size:
            continue
        columns = decode_part(bytes(arrays))
        for step, row in zip(common.tolist(), theirs.tolist(), strict=True):
            by_step[step].append((source, {n: a[row] for n, a in columns.items()}))
            seen = info.get(step)
            if seen is None or received_at > seen[2]:
                info[step] = (int(sources), signature, received_at)
    found = [
        PendingStep(
            step,
            info[step][0],
            info[step][2],
            sorted(parts, key=lambda part: source_order(part[0])),
            info[step][1],
        )
        for step, parts in by_step.items()
    ]
    return found, dropped


def newest_incomplete(conn: Connection, job: str) -> tuple[int, int, list[str]] | None:
    """The job's newest incomplete step: ``(step, sources, received sources)``."""
    segments = conn.execute(
        Statement(
            "SELECT source, steps, sources FROM job_segments WHERE job = ? AND pending > 0",
            "SELECT source, steps, sources FROM job_segments WHERE job = %s AND pending > 0",
        ),
        (job,),
    ).fetchall()
    steps = _incomplete(conn, job, segments, 0, 2**63 - 1)
    if not steps.size:
        return None
    step = int(steps[-1])
    holding = [row for row in segments if np.isin(step, _steps_of(row[1]))]
    return step, int(holding[0][2]), sorted((row[0] for row in holding), key=source_order)


def incomplete_jobs(conn: Connection) -> list[tuple[str, int, int, int]]:
    """Per job with an incomplete step: ``(job, newest incomplete step, sources,
    received)``."""
    out = []
    for (job,) in conn.execute(
        Statement(
            "SELECT DISTINCT job FROM job_segments WHERE pending > 0",
            "SELECT DISTINCT job FROM job_segments WHERE pending > 0",
        )
    ):
        found = newest_incomplete(conn, job)
        if found is not None:
            out.append((job, found[0], found[1], len(found[2])))
    return out
