"""Migrations: an older file is brought up to the current schema in place, keeping its
data; a file from a newer schema is refused. (The version 3 -> 4 migration of pending
parts is tested with the job tables, in ``test_jobs.py``.)"""

from __future__ import annotations

import sqlite3

import anyio
import pytest

from app.core.errors import StepConflict
from app.storage import jobs as store_jobs
from app.storage import plans
from app.storage.db import Store, StoreUnusable
from app.storage.migrations import MIGRATIONS, SCHEMA_VERSION


def _point(step: int, reduced: str) -> store_jobs.PushItem:
    return store_jobs.PushItem(
        step=step, source="", sources=1, digest=reduced, num_devices=1, reduced=reduced
    )


def _no_merge(_parts, _signature):
    raise AssertionError("single-source points are never merged")


# The schema of app/storage/db.py at version 1 (commit 6a03617), as files written then hold it.
V1_SCHEMA = """
CREATE TABLE plans (id TEXT PRIMARY KEY, created_at TEXT NOT NULL, name TEXT,
    live INTEGER NOT NULL DEFAULT 0, body TEXT NOT NULL, summary TEXT NOT NULL);
CREATE TABLE job_points (job TEXT NOT NULL, step INTEGER NOT NULL, reduced TEXT NOT NULL,
    received_at TEXT NOT NULL, PRIMARY KEY (job, step));
CREATE TABLE sessions (id TEXT PRIMARY KEY, mesh_id TEXT NOT NULL, created_at TEXT NOT NULL,
    body TEXT NOT NULL);
CREATE INDEX sessions_by_mesh ON sessions (mesh_id);
"""


def test_a_version_1_file_is_migrated_in_place_and_keeps_its_data(tmp_path):
    path = tmp_path / "v1.sqlite"
    old = sqlite3.connect(path)
    old.executescript(V1_SCHEMA)
    old.execute("PRAGMA journal_mode = WAL")
    old.execute("INSERT INTO plans VALUES ('m_1', 't', 'p', 1, '{\"id\":\"m_1\"}', '{}')")
    rows = [("old", s, f'{{"loss":{s / 2},"v":[1,2]}}', "2026-01-01T00:00:00Z") for s in range(40)]
    old.executemany("INSERT INTO job_points VALUES (?, ?, ?, ?)", rows)
    old.commit()
    old.close()
    check = sqlite3.connect(path)  # closed: the store locks the file exclusively
    assert check.execute("PRAGMA user_version").fetchone()[0] == 0
    check.close()

    store = Store(path)
    store.open()
    try:
        assert store.schema_version == SCHEMA_VERSION
        assert anyio.run(plans.get_plan, store, "m_1") == '{"id":"m_1"}'
        job = anyio.run(store.read, lambda c: store_jobs.get_job(c, "old"))
        assert (job.points, job.first_step, job.last_step) == (40, 0, 39)
        page, _ = anyio.run(
            store.read, lambda c: store_jobs.history_page(c, "old", 0, 100, 100, False)
        )
        assert [p.reduced for p in page] == [r[2] for r in rows]
        # Rollups were derived from the old points: a downsampled read sees them all.
        width, buckets = anyio.run(store.read, lambda c: store_jobs.downsample(c, "old", 0, 39, 2))
        assert sum(b.metrics["loss"][0] for b in buckets) == 40 and "v" not in buckets[0].metrics
        assert buckets[-1].metrics["loss"][5] == 19.5
        # An old point, pushed again with the same values, is a no-op; other values conflict.
        same = [_point(3, rows[3][2])]
        anyio.run(store.write, lambda c: store_jobs.push(c, "old", same, "t", _no_merge))
        assert same[0].created is False
        with pytest.raises(StepConflict):
            anyio.run(
                store.write,
                lambda c: store_jobs.push(c, "old", [_point(3, '{"loss":9}')], "t", _no_merge),
            )
    finally:
        store.close()
    # Opening again is a no-op (already current).
    again = Store(path)
    again.open()
    assert again.schema_version == SCHEMA_VERSION
    again.close()


def test_a_file_from_a_newer_schema_is_refused(tmp_path):
    path = tmp_path / "new.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE plans (id TEXT)")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(StoreUnusable, match="newer"):
        Store(path).open()
    # read before anything wrote: byte for byte as it was, no WAL beside it
    assert path.read_bytes() == before and not path.with_name("new.sqlite-wal").exists()


def test_a_foreign_database_is_refused_untouched(tmp_path):
    path = tmp_path / "foreign.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO customers (name) VALUES ('ada')")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(StoreUnusable, match="not this service's"):
        Store(path).open()
    assert path.read_bytes() == before and not path.with_name("foreign.sqlite-wal").exists()


def test_every_version_up_to_the_current_one_has_its_migration():
    assert sorted(MIGRATIONS) == list(range(2, SCHEMA_VERSION + 1))
