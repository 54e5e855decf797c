"""Every table's schema and every migration of the store's SQLite file, in one place.

A file's ``PRAGMA user_version`` says which schema it holds. :class:`app.storage.db.Store`
creates the base tables (:data:`SCHEMA`) on every connection, then brings an older file up
to :data:`SCHEMA_VERSION` in place, one transaction per version (:data:`MIGRATIONS`). The
compile-check tables (:data:`COMPILE_CHECKS_SCHEMA`) are created by
:class:`app.storage.compile_checks.CompileStore` when it opens, and need no migration yet.

Versions, each with the migration that brings the one before it up to it:

- 1 (written as 0 by SQLite): plans, ``job_points (job, step, reduced, received_at)``,
  sessions;
- 2 (:func:`migrate_to_v2`): the job tables of :mod:`app.storage.jobs` (``jobs``,
  ``job_rollups``, per-source ``job_parts``) and three new ``job_points`` columns;
- 3 (:func:`migrate_to_v3`): ``job_pending``, one row per incomplete multi-source step;
- 4 (:func:`migrate_to_v4`): multi-source parts stored per source and push
  (``job_segments``, ``job_coverage``, :mod:`app.storage.parts`), replacing ``job_parts``
  and ``job_pending``.

Every migration is idempotent: one interrupted half-way runs again on the next open.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable

import numpy as np

from app.storage.part_blobs import decode_part, encode_part, row_hashes
from app.storage.parts import COVERAGE_BITS, _steps_of, encode_coverage
from app.storage.rollups import ROLLUP_UPSERT, rollup_rows, scalar_values

SCHEMA_VERSION = 4
"""``PRAGMA user_version`` of a current file. 1 (written as 0 by SQLite): plans,
``job_points (job, step, reduced, received_at)``, sessions. 2: the job tables of
:mod:`app.storage.jobs`. 3: its ``job_pending`` (per incomplete multi-source step). 4:
multi-source parts stored per source and push (``job_segments``, :mod:`app.storage.parts`),
replacing ``job_parts`` and ``job_pending``. ``job_links`` (a job's plan, DESIGN v1.3),
``calibrations`` (measured calibration profiles) and ``job_spreads`` /
``job_spread_blocks`` (device spread, :mod:`app.storage.spreads`) and ``work_owners``
(:mod:`app.storage.owners`) are added tables that
:data:`SCHEMA` creates in every file it opens, old ones included.
``open()`` migrates an older file in place, one transaction per version."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS plans (
    id          TEXT PRIMARY KEY,
    created_at  TEXT NOT NULL,
    name        TEXT,
    live        INTEGER NOT NULL DEFAULT 0,
    body        TEXT NOT NULL,
    summary     TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS job_points (
    job         TEXT NOT NULL,
    step        INTEGER NOT NULL,
    reduced     TEXT NOT NULL,
    received_at TEXT NOT NULL,
    PRIMARY KEY (job, step)
);
CREATE TABLE IF NOT EXISTS job_spreads (
    job         TEXT NOT NULL,
    step        INTEGER NOT NULL,
    spread      BLOB NOT NULL,
    PRIMARY KEY (job, step)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS job_spread_blocks (
    job          TEXT NOT NULL,
    level        INTEGER NOT NULL,
    metric       TEXT NOT NULL,
    block        INTEGER NOT NULL,
    low          REAL NOT NULL,
    low_device   INTEGER NOT NULL,
    low_step     INTEGER NOT NULL,
    high         REAL NOT NULL,
    high_device  INTEGER NOT NULL,
    high_step    INTEGER NOT NULL,
    PRIMARY KEY (job, level, metric, block)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS job_links (
    job              TEXT PRIMARY KEY,
    plan             TEXT NOT NULL,
    step_time_metric TEXT NOT NULL,
    linked_at        TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS calibrations (
    id            TEXT PRIMARY KEY,
    created_at    TEXT NOT NULL,
    kind          TEXT NOT NULL,
    hardware_kind TEXT NOT NULL,
    device_kind   TEXT,
    body          TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    id          TEXT PRIMARY KEY,
    mesh_id     TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    body        TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_by_mesh ON sessions (mesh_id);
CREATE TABLE IF NOT EXISTS work_owners (
    kind        TEXT NOT NULL,
    id          TEXT NOT NULL,
    owner       INTEGER NOT NULL,
    PRIMARY KEY (kind, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS store_probe (
    id          INTEGER PRIMARY KEY,
    at          TEXT NOT NULL
);
"""

COMPILE_CHECKS_SCHEMA = """
CREATE TABLE IF NOT EXISTS compile_checks (
    id          TEXT PRIMARY KEY,
    mesh_id     TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    status      TEXT NOT NULL,
    body        TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS compile_checks_by_mesh ON compile_checks (mesh_id, id);
CREATE TABLE IF NOT EXISTS compile_results (
    key         TEXT PRIMARY KEY,
    created_at  TEXT NOT NULL,
    result      TEXT NOT NULL
);
"""

SCHEMA_V2 = """
CREATE TABLE IF NOT EXISTS jobs (
    job          TEXT PRIMARY KEY,
    created_at   TEXT NOT NULL,
    last_push_at TEXT NOT NULL,
    finished     INTEGER NOT NULL DEFAULT 0,
    points       INTEGER NOT NULL DEFAULT 0,
    first_step   INTEGER,
    last_step    INTEGER
);
CREATE INDEX IF NOT EXISTS jobs_by_last_push ON jobs (last_push_at);
CREATE TABLE IF NOT EXISTS job_parts (
    job          TEXT NOT NULL,
    step         INTEGER NOT NULL,
    source       TEXT NOT NULL,
    sources      INTEGER NOT NULL,
    digest       TEXT NOT NULL,
    signature    TEXT NOT NULL,
    num_devices  INTEGER NOT NULL,
    arrays       BLOB,
    received_at  TEXT NOT NULL,
    PRIMARY KEY (job, step, source)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS job_parts_pending ON job_parts (job, step) WHERE arrays IS NOT NULL;
CREATE TABLE IF NOT EXISTS job_rollups (
    job          TEXT NOT NULL,
    level        INTEGER NOT NULL,
    metric       TEXT NOT NULL,
    block        INTEGER NOT NULL,
    n            INTEGER NOT NULL,
    total        REAL NOT NULL,
    low          REAL,
    high         REAL,
    last_step    INTEGER NOT NULL,
    last         REAL,
    PRIMARY KEY (job, level, metric, block)
) WITHOUT ROWID;
"""

SCHEMA_V3 = """
CREATE TABLE IF NOT EXISTS job_pending (
    job          TEXT NOT NULL,
    step         INTEGER NOT NULL,
    sources      INTEGER NOT NULL,
    signature    TEXT NOT NULL,
    num_devices  INTEGER NOT NULL,
    parts        INTEGER NOT NULL,
    PRIMARY KEY (job, step)
) WITHOUT ROWID
"""

_POINT_COLUMNS_V2 = (
    ("digest", "TEXT"),
    ("sources", "INTEGER NOT NULL DEFAULT 1"),
    ("num_devices", "INTEGER"),
)


def migrate_to_v2(conn: sqlite3.Connection) -> None:
    """Version 1 (``job_points (job, step, reduced, received_at)``) -> version 2, in place.

    Idempotent. Adds the new columns and tables, and derives ``jobs`` and ``job_rollups``
    from the existing points, so an old file keeps its history and reads it fast.
    """
    for statement in SCHEMA_V2.split(";"):
        if statement.strip():
            conn.execute(statement)
    have = {row[1] for row in conn.execute("PRAGMA table_info(job_points)")}
    for name, kind in _POINT_COLUMNS_V2:
        if name not in have:
            conn.execute(f"ALTER TABLE job_points ADD COLUMN {name} {kind}")
    conn.execute(
        "INSERT OR IGNORE INTO jobs (job, created_at, last_push_at, points, first_step, last_step) "
        "SELECT job, MIN(received_at), MAX(received_at), COUNT(*), MIN(step), MAX(step) "
        "FROM job_points GROUP BY job"
    )
    if conn.execute("SELECT 1 FROM job_rollups LIMIT 1").fetchone() is None:
        cursor = conn.execute("SELECT job, step, reduced FROM job_points ORDER BY job, step")
        while rows := cursor.fetchmany(10_000):
            by_job: dict[str, list[tuple[int, dict[str, float]]]] = {}
            for job, step, reduced in rows:
                by_job.setdefault(job, []).append((int(step), scalar_values(json.loads(reduced))))
            for job, points in by_job.items():
                conn.executemany(ROLLUP_UPSERT.sqlite, rollup_rows(job, points))


def migrate_to_v3(conn: sqlite3.Connection) -> None:
    """Version 2 -> 3, in place and idempotent: ``job_pending``, derived from the parts of
    the incomplete steps."""
    conn.execute(SCHEMA_V3)
    conn.execute("DELETE FROM job_pending")
    conn.execute(
        "INSERT INTO job_pending (job, step, sources, signature, num_devices, parts) "
        "SELECT job, step, MAX(sources), MAX(signature), MAX(num_devices), COUNT(*) "
        "FROM job_parts WHERE arrays IS NOT NULL GROUP BY job, step"
    )


SCHEMA_V4 = """
CREATE TABLE IF NOT EXISTS job_segments (
    id           INTEGER PRIMARY KEY,
    job          TEXT NOT NULL,
    source       TEXT NOT NULL,
    first_step   INTEGER NOT NULL,
    last_step    INTEGER NOT NULL,
    sources      INTEGER NOT NULL,
    signature    TEXT NOT NULL,
    num_devices  INTEGER NOT NULL,
    steps        BLOB NOT NULL,
    hashes       BLOB NOT NULL,
    arrays       BLOB,
    pending      INTEGER NOT NULL,
    received_at  TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS job_segments_by_source
    ON job_segments (job, source, last_step);
CREATE INDEX IF NOT EXISTS job_segments_by_last ON job_segments (job, last_step);
CREATE INDEX IF NOT EXISTS job_segments_open ON job_segments (job, first_step)
    WHERE pending > 0;
CREATE TABLE IF NOT EXISTS job_coverage (
    job          TEXT NOT NULL,
    chunk        INTEGER NOT NULL,
    counts       BLOB NOT NULL,
    PRIMARY KEY (job, chunk)
) WITHOUT ROWID;
"""


def migrate_to_v4(conn: sqlite3.Connection) -> None:
    """Version 3 -> 4, in place: every ``job_parts`` row becomes a one-step segment (a
    pending part with its arrays and hash; a part of a complete step with hash 0, since
    its arrays are gone: a retry of it is taken as the same content), then ``job_parts``
    and ``job_pending`` are dropped."""
    for statement in SCHEMA_V4.split(";"):
        if statement.strip():
            conn.execute(statement)
    have = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "job_parts" in have:
        cursor = conn.execute(
            "SELECT job, step, source, sources, signature, num_devices, arrays, received_at "
            "FROM job_parts ORDER BY job, source, step"
        )
        while rows := cursor.fetchmany(1000):
            segments = []
            for job, step, source, sources, signature, num_devices, arrays, at in rows:
                hashed = 0
                stacked = None
                if arrays is not None:
                    part = decode_part(bytes(arrays))
                    stacked = {n: np.asarray(a)[None, ...] for n, a in part.items()}
                    hashed = int(row_hashes([stacked[n] for n in sorted(stacked)])[0])
                segments.append(
                    (
                        job,
                        source,
                        step,
                        step,
                        sources,
                        signature,
                        num_devices,
                        np.array([step], "<i8").tobytes(),
                        np.array([hashed], "<u8").tobytes(),
                        None if stacked is None else encode_part(stacked),
                        0 if stacked is None else 1,
                        at,
                    )
                )
            conn.executemany(
                "INSERT INTO job_segments (job, source, first_step, last_step, sources, "
                "signature, num_devices, steps, hashes, arrays, pending, received_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                segments,
            )
        conn.execute("DROP TABLE job_parts")
        for (job,) in conn.execute("SELECT DISTINCT job FROM job_segments").fetchall():
            held = [
                _steps_of(blob)
                for (blob,) in conn.execute("SELECT steps FROM job_segments WHERE job = ?", (job,))
            ]
            steps, counts = np.unique(np.concatenate(held), return_counts=True)
            for chunk in np.unique(steps >> COVERAGE_BITS).tolist():
                mask = (steps >> COVERAGE_BITS) == chunk
                block = np.zeros(1 << COVERAGE_BITS, dtype="<u2")
                block[steps[mask] - (chunk << COVERAGE_BITS)] = counts[mask]
                conn.execute(
                    "INSERT OR REPLACE INTO job_coverage VALUES (?, ?, ?)",
                    (job, chunk, encode_coverage(block)),
                )
    if "job_pending" in have:
        conn.execute("DROP TABLE job_pending")


MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {
    2: migrate_to_v2,
    3: migrate_to_v3,
    4: migrate_to_v4,
}
"""version -> the function that brings a file of the version before it up to it."""
