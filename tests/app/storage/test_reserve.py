"""The space reserve for deletes on a full disk (:mod:`app.storage.reserve`): the file, its
signature, what it never touches (a file that is not the service's, a database that is not
the service's), the fence, and a job deleted in pieces. On a real full disk:
``tests/e2e/test_storage_faults.py``."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from app.core.errors import StorageFull
from app.main import create_app
from app.storage import db as store_module
from app.storage import jobs as store_jobs
from app.storage import plans
from app.storage.db import SCHEMA_VERSION, Store, StoreUnusable
from app.storage.reserve import RESERVE_BYTES, SIGNATURE, SpaceReserve
from tests.helpers import StubRuntime, TestClient, make_settings


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "db.sqlite")
    s.open()
    yield s
    s.close()


def _reserve(db: Path) -> Path:
    return Path(f"{db}-reserve")


def _assert_held(reserve: Path) -> None:
    """The reserve is the service's and holds its room in real blocks (not sparse)."""
    stats = reserve.stat()
    assert stats.st_size == RESERVE_BYTES
    assert stats.st_blocks * 512 >= RESERVE_BYTES
    with open(reserve, "rb") as held:
        assert held.read(len(SIGNATURE)) == SIGNATURE


def test_the_reserve_is_made_beside_an_accepted_database_with_real_blocks(store):
    _assert_held(_reserve(store.path))
    room = store._db.room
    assert room.reserve.present and not room.fenced and room.reserve.missing == ""


def test_the_reserve_is_kept_across_restarts_and_one_cut_off_is_completed(tmp_path):
    db = tmp_path / "db.sqlite"
    first = Store(db)
    first.open()
    first.close()
    before = _reserve(db).stat()
    again = Store(db)
    again.open()  # kept as it is: not made again
    after = _reserve(db).stat()
    again.close()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    os.truncate(_reserve(db), len(SIGNATURE) + 10)  # its making was cut off
    third = Store(db)
    third.open()
    try:
        _assert_held(_reserve(db))
        assert third._db.room.reserve.present
    finally:
        third.close()


def test_a_file_at_the_reserve_path_that_is_not_the_services_is_left_untouched(tmp_path):
    db = tmp_path / "db.sqlite"
    theirs = _reserve(db)
    theirs.write_bytes(b"the user's own file, not a reserve\n" * 1000)
    before = theirs.read_bytes()
    store = Store(db)
    store.open()
    try:
        reserve = store._db.room.reserve
        assert not reserve.present and not reserve.for_lack_of_room
        assert "not the service's" in reserve.missing and "left untouched" in reserve.missing
        assert not store._db.room.fenced  # no reserve to keep, so no room held back
        plans.insert_plan_sync(store, "m_1", "t", None, False, "{}")
        assert anyio.run(plans.delete_plan, store, "m_1") is True
        assert reserve.release() is False
    finally:
        store.close()
    assert theirs.read_bytes() == before


def test_a_reserve_replaced_by_another_file_is_not_removed(tmp_path):
    reserve = SpaceReserve(tmp_path / "db.sqlite")
    assert reserve.keep()
    reserve.path.unlink()
    reserve.path.write_bytes(b"someone else's file")
    assert reserve.release() is False
    assert reserve.path.read_bytes() == b"someone else's file"


def _garbage(db: Path) -> None:
    db.write_bytes(b"not a database\n" * 300)


def _foreign_tables(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    conn.commit()
    conn.close()


def _newer_version(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE plans (id TEXT)")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()


@pytest.mark.parametrize(
    "make", [_garbage, _foreign_tables, _newer_version], ids=["garbage", "foreign", "newer"]
)
def test_a_database_that_is_not_the_services_gets_no_reserve(tmp_path, make):
    db = tmp_path / "db.sqlite"
    make(db)
    before = db.read_bytes()
    with pytest.raises(StoreUnusable):
        Store(db).open()
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db.sqlite"]  # no reserve, no WAL


def test_a_moved_database_uses_the_reserve_beside_it(tmp_path):
    """Moved with its database, the reserve is kept (it names no path); one left behind
    serves whatever database is at its old place (a new, empty one after a "move it aside
    to start empty"), never read as data."""
    old, new = tmp_path / "old" / "db.sqlite", tmp_path / "new" / "db.sqlite"
    store = Store(old)
    store.open()
    plans.insert_plan_sync(store, "m_1", "t", None, False, "{}")
    store.close()
    new.parent.mkdir()
    for suffix in ("", "-reserve"):
        Path(f"{old}{suffix}").rename(f"{new}{suffix}")
    inode = _reserve(new).stat().st_ino
    moved = Store(new)
    moved.open()
    try:
        assert _reserve(new).stat().st_ino == inode and moved._db.room.reserve.present
        assert anyio.run(plans.get_plan, moved, "m_1") == "{}"
    finally:
        moved.close()
    _reserve(new).rename(_reserve(old))  # the reserve left behind at the old place
    fresh = Store(old)
    fresh.open()
    try:
        assert fresh._db.room.reserve.present and anyio.run(plans.get_plan, fresh, "m_1") is None
    finally:
        fresh.close()


def test_an_in_memory_store_has_no_reserve_and_deletes_as_it_writes():
    store = Store(":memory:")
    store.open()
    try:
        assert store._db.room is None
        plans.insert_plan_sync(store, "m_1", "t", None, False, "{}")
        assert anyio.run(plans.delete_plan, store, "m_1") is True
        assert anyio.run(plans.delete_plan, store, "m_1") is False
    finally:
        store.close()


# ------------------------------------------------------------------------- the fence


def _plan(store: Store, plan_id: str, size: int = 20_000) -> None:
    plans.insert_plan_sync(store, plan_id, "t", None, False, "{}" + " " * size)


def test_the_fence_keeps_writes_in_the_files_free_pages(store, monkeypatch):
    """Fenced (the reserve missing for lack of room), writes reuse freed pages only: past
    them they are 507 ``storage_full`` with nothing written; each commit is checkpointed,
    so the WAL restarts in place instead of growing. Lifted, the file grows again."""
    # The disk never has room enough to make the reserve again (the fence stays).
    monkeypatch.setattr(store_module, "FREE_BYTES_TO_RECOVER", 2**62)
    for i in range(20):
        _plan(store, f"m_{i}")
    for i in range(10):
        assert anyio.run(plans.delete_plan, store, f"m_{i}")
    room = store._db.room
    room.fence(store._conn)
    pages = store._run(lambda c: c.execute("PRAGMA page_count").fetchone()[0])
    assert room.room(store._conn, store.path) == store._run(
        lambda c: c.execute("PRAGMA freelist_count").fetchone()[0] * 4096
    )
    wal = Path(f"{store.path}-wal")
    extent = wal.stat().st_size
    stored = []
    with pytest.raises(StorageFull):
        for i in range(100, 200):
            _plan(store, f"m_{i}")
            stored.append(f"m_{i}")
            assert wal.stat().st_size <= extent  # checkpointed: the WAL restarts in place
    assert 5 <= len(stored) <= 12  # about the ten plans' worth of freed pages
    assert store.full
    assert store._run(lambda c: c.execute("PRAGMA page_count").fetchone()[0]) == pages
    assert anyio.run(plans.get_plan, store, f"m_{100 + len(stored)}") is None  # all or nothing
    room.lift(store._conn)
    _plan(store, "m_after")
    assert store._run(lambda c: c.execute("PRAGMA page_count").fetchone()[0]) > pages


# ---------------------------------------------------------------- a job in pieces


def _push(client, job: str) -> None:
    """A job with every kind of history row: points, rollups, multi-source parts
    (segments and coverage)."""
    points = [{"step": s, "metrics": {"loss": [float(s), 1.0], "lr": 0.1}} for s in range(300)]
    assert client.post(f"/v1/jobs/{job}/metrics/batch", json={"points": points}).status_code == 201
    for step in range(300, 340):
        part = {"step": step, "source": "h0", "sources": 2, "metrics": {"loss": [1.0, 2.0]}}
        assert client.post(f"/v1/jobs/{job}/metrics", json=part).status_code == 201


_TABLES = ("jobs", *store_jobs._HISTORY_KEYS, "job_links")  # every table of a job
_PUSHED = ("jobs", "job_points", "job_segments", "job_coverage", "job_rollups")


def _rows(store: Store, job: str) -> dict[str, int]:
    return {
        table: store._run(
            lambda c, t=table: c.execute(f"SELECT count(*) FROM {t} WHERE job = ?", (job,))
        ).fetchone()[0]
        for table in _TABLES
    }


def test_a_job_deleted_in_pieces_leaves_what_a_whole_delete_leaves(tmp_path):
    with TestClient(create_app(make_settings(tmp_path), runtime=StubRuntime(ready=True))) as client:
        for job in ("doomed", "kept"):
            _push(client, job)
        store = client.app.state.store
        kept = _rows(store, "kept")
        doomed = _rows(store, "doomed")
        assert all(doomed[t] for t in _PUSHED), doomed
        pieces = 0
        while store.write_here(lambda c: store_jobs.delete_job_piece(c, "doomed", 16)):
            pieces += 1
            left = _rows(store, "doomed")
            assert left["jobs"] == 1  # the job stays a job until its last piece
        assert pieces > 10
        assert store.write_here(lambda c: store_jobs.delete_job(c, "doomed")) is True
        assert _rows(store, "doomed") == dict.fromkeys(_TABLES, 0)
        assert _rows(store, "kept") == kept
        assert client.get("/v1/jobs/doomed").status_code == 404
        history = client.get("/v1/jobs/kept/metrics", params={"limit": 1000}).json()
        assert [p["step"] for p in history["points"]] == list(range(300))


# ------------------------------------- judged through its WAL (a crash, a full disk)


def _killed_writer(db: Path, code: str) -> None:
    """Runs ``code`` (a database ``conn`` or store on ``db``) in a process that then dies
    without closing: the WAL keeps its frames, nothing is checkpointed."""
    script = f"import os, sqlite3, sys\ndb = sys.argv[1]\n{code}\nos._exit(0)\n"
    subprocess.run(
        [sys.executable, "-c", script, str(db)],
        check=True,
        timeout=60,
        cwd=Path(__file__).parents[3],
    )


def test_a_main_file_unreadable_alone_opens_through_its_wal(tmp_path):
    """A checkpoint cut off (by a crash, or a full disk: SQLite then writes the main file
    only in part) leaves a main file that does not read alone; the WAL still holds the
    database whole, so the file opens and nothing is lost."""
    db = tmp_path / "db.sqlite"
    _killed_writer(
        db,
        "from app.storage.db import Store\nfrom app.storage import plans\n"
        "s = Store(db)\ns.open()\nplans.insert_plan_sync(s, 'm_1', 't', None, False, '{}')",
    )
    data = bytearray(db.read_bytes())
    data[100:4096] = os.urandom(3996)  # page 1 past its header: its good copy is in the WAL
    db.write_bytes(bytes(data))
    store = Store(db)
    store.open()
    try:
        assert anyio.run(plans.get_plan, store, "m_1") == "{}"
        plans.insert_plan_sync(store, "m_2", "t", None, False, "{}")
    finally:
        store.close()


def test_a_foreign_database_whose_tables_are_in_its_wal_is_left_untouched(tmp_path):
    db = tmp_path / "db.sqlite"
    _killed_writer(
        db,
        "conn = sqlite3.connect(db)\nconn.execute('PRAGMA journal_mode = WAL')\n"
        "conn.execute('CREATE TABLE invoices (id INTEGER PRIMARY KEY)')\nconn.commit()",
    )
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert files["db.sqlite-wal"]  # the table is only there
    with pytest.raises(StoreUnusable, match="not this service's"):
        Store(db).open()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files  # no reserve either
