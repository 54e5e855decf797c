"""Storage faults: an unusable database at start, and a full disk while serving.

The first runs the real ``datarax-serve``; the second fills a real SQLite file (SQLite's
``max_page_count`` makes it answer SQLITE_FULL exactly as a full disk does) under the
in-process app.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess

import pytest

import app.store as store_module
from app.cli import EXIT_BAD_DATABASE
from app.main import create_app
from tests.helpers import (
    ServiceProcess,
    StubRuntime,
    TestClient,
    assert_problem,
    make_settings,
)

pytestmark = pytest.mark.timeout(120)


def _garbage(path):
    path.write_bytes(b"this is not an SQLite database, it is the user's file\n" * 200)


def _truncated(path):
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
        conn.executemany("INSERT INTO t VALUES (?)", [(b"x" * 1000,) for _ in range(50)])
    conn.close()
    data = path.read_bytes()
    path.write_bytes(data[:100] + b"\xff" * 400)  # a header, then noise


@pytest.mark.parametrize("damage", [_garbage, _truncated], ids=["not-sqlite", "truncated"])
def test_unusable_database_is_one_line_and_its_own_exit_code(tmp_path, damage):
    db = tmp_path / "datarax.sqlite"
    damage(db)
    before = db.read_bytes()
    service = ServiceProcess(db, tmp_path / "server.log")
    done = subprocess.run(
        service.command(),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DATARAX_PLATFORMS": "cpu"},
        check=False,
    )
    assert done.returncode == EXIT_BAD_DATABASE, (done.returncode, done.stderr[-2000:])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert str(db) in lines[0] and "Traceback" not in done.stderr
    assert db.read_bytes() == before  # never overwritten


def test_full_disk_is_507_storage_full_and_readiness_says_so(tmp_path):
    settings = make_settings(tmp_path)
    with TestClient(create_app(settings, runtime=StubRuntime(ready=True))) as client:
        plan = {"axes": {"data": 8}, "num_devices": 8}
        assert client.post("/v1/meshes", json=plan).status_code == 201
        assert client.get("/health/ready").status_code == 200
        store = client.app.state.store
        pages = store._run(lambda c: c.execute("PRAGMA page_count").fetchone()[0])
        store._run(lambda c: c.execute(f"PRAGMA max_page_count = {pages}"))
        big = {"axes": {"data": -1}, "num_devices": 4096}
        assert_problem(client.post("/v1/meshes", json=big), 507, "storage_full")
        # The real disk has room, so readiness clears once it looks; make it look full.
        store.full = True
        free_needed = store_module.FREE_BYTES_TO_RECOVER
        store_module.FREE_BYTES_TO_RECOVER = 2**62  # no disk has this much free
        try:
            assert_problem(client.get("/health/ready"), 507, "storage_full")
        finally:
            store_module.FREE_BYTES_TO_RECOVER = free_needed
        store._run(lambda c: c.execute("PRAGMA max_page_count = 1073741823"))
        assert client.get("/health/ready").status_code == 200
        assert client.post("/v1/meshes", json=big).status_code == 201
