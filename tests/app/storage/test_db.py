"""The storage engine: durability settings, one connection per file, transactions,
concurrency and storage faults."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import pytest

from app.core.errors import StepConflict, StorageUnavailable
from app.storage import jobs as store_jobs
from app.storage import plans, sessions
from app.storage.db import Store, StoreClosed
from app.storage.errors import Conflict


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "sub" / "db.sqlite")
    s.open()
    yield s
    s.close()


def test_wal_and_full_sync(store):
    assert store._run(lambda c: c.execute("PRAGMA journal_mode").fetchone()[0]) == "wal"
    assert store._run(lambda c: c.execute("PRAGMA synchronous").fetchone()[0]) == 2  # FULL
    assert store._run(lambda c: c.execute("PRAGMA busy_timeout").fetchone()[0]) > 0
    # FAST: freed pages are not rewritten just to zero them (2 = FAST; this SQLite
    # build's default is 1, which rewrote every page a merged step's parts freed).
    assert store._run(lambda c: c.execute("PRAGMA secure_delete").fetchone()[0]) == 2


def _point(step: int, reduced: str) -> store_jobs.PushItem:
    return store_jobs.PushItem(
        step=step, source="", sources=1, digest=reduced, num_devices=1, reduced=reduced
    )


def _no_merge(_parts, _signature):
    raise AssertionError("single-source points are never merged")


def test_job_points_are_written_once_and_read_in_step_order(store):
    async def main():
        push = store_jobs.push
        await store.write(lambda c: push(c, "j", [_point(5, '{"a":1}')], "t1", _no_merge))
        await store.write(lambda c: push(c, "j", [_point(1, '{"a":2}')], "t2", _no_merge))
        same = [_point(5, '{"a":1}')]
        await store.write(lambda c: push(c, "j", same, "t3", _no_merge))
        assert same[0].created is False and same[0].received_at == "t1"
        with pytest.raises(StepConflict):
            await store.write(lambda c: push(c, "j", [_point(5, '{"a":3}')], "t3", _no_merge))
        page, more = await store.read(
            lambda c: store_jobs.history_page(c, "j", 0, 10, 10, include_partial=False)
        )
        assert [(p.step, p.reduced, p.received_at) for p in page] == [
            (1, '{"a":2}', "t2"),
            (5, '{"a":1}', "t1"),
        ]
        assert more is False

    anyio.run(main)


def test_concurrent_writers_from_threads(store):
    errors: list[BaseException] = []

    def writer(t: int) -> None:
        try:
            for i in range(50):
                plans.insert_plan_sync(store, f"m_{t}_{i}", "t", None, False, "{}")
        except BaseException as exc:  # noqa: BLE001 - collected and re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert store._run(lambda c: c.execute("SELECT COUNT(*) FROM plans").fetchone()[0]) == 400


def test_concurrent_async_requests(store):
    async def main():
        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(
                    store.write,
                    lambda c, i=i: store_jobs.push(c, "j", [_point(i, "{}")], "t", _no_merge),
                )
                tg.start_soon(store.read, lambda c: store_jobs.get_job(c, "j"))
        job = await store.read(lambda c: store_jobs.get_job(c, "j"))
        assert (job.points, job.first_step, job.last_step) == (40, 0, 39)

    anyio.run(main)


def test_reopen_keeps_data(tmp_path):
    path = tmp_path / "db.sqlite"
    first = Store(path)
    first.open()
    plans.insert_plan_sync(first, "m_1", "t", "x", True, '{"id":"m_1"}')
    first.close()
    second = Store(path)
    second.open()
    try:
        assert anyio.run(plans.get_plan, second, "m_1") == '{"id":"m_1"}'
    finally:
        second.close()


def test_closed_store_refuses(tmp_path):
    s = Store(tmp_path / "db.sqlite")
    with pytest.raises(StoreClosed):
        plans.insert_plan_sync(s, "m", "t", None, False, "{}")
    assert s.ping() is False


def test_failed_write_rolls_back_and_the_store_stays_usable(store):
    def bad(conn):
        conn.execute(
            "INSERT INTO plans (id, created_at, body, summary) VALUES ('m_x', 't', '{}', '{}')"
        )
        raise RuntimeError("fail inside the transaction")

    with pytest.raises(RuntimeError):
        store._write(bad)
    assert anyio.run(plans.get_plan, store, "m_x") is None
    plans.insert_plan_sync(store, "m_y", "t", None, False, "{}")
    assert anyio.run(plans.get_plan, store, "m_y") == "{}"


# ------------------------------------------------------- one connection, no -shm, faults


def _mapped_shm() -> list[str]:
    return [line for line in open("/proc/self/maps").read().splitlines() if "-shm" in line]


def test_no_shared_memory_wal_index_is_created_or_mapped(store):
    """WAL in exclusive locking mode keeps the wal-index in heap memory: no ``-shm`` file
    exists or is mapped, so nothing can SIGBUS the process when storage fails."""
    for i in range(50):
        plans.insert_plan_sync(store, f"m_{i}", "t", None, False, "{}" + " " * 4000)
    assert store._run(lambda c: c.execute("PRAGMA locking_mode").fetchone()[0]) == "exclusive"
    assert store._run(lambda c: c.execute("PRAGMA mmap_size").fetchone()[0]) == 0
    assert store._run(lambda c: c.execute("PRAGMA journal_mode").fetchone()[0]) == "wal"
    assert Path(f"{store.path}-wal").exists()
    assert not Path(f"{store.path}-shm").exists()
    assert _mapped_shm() == []


def test_stores_on_one_file_share_its_one_connection(tmp_path):
    path = tmp_path / "db.sqlite"
    first = Store(path)
    first.open()
    (tmp_path / "sub").mkdir()
    second = Store(tmp_path / "sub" / ".." / "db.sqlite")  # another spelling, same file
    second.open()
    assert first._conn is second._conn and first._lock is second._lock
    plans.insert_plan_sync(second, "m_1", "t", None, False, "{}")
    second.close()
    assert anyio.run(plans.get_plan, first, "m_1") == "{}"  # still open for the other store
    first.close()
    reader = sqlite3.connect(path, timeout=0.1)  # closed with the last store: unlocked
    assert reader.execute("SELECT count(*) FROM plans").fetchone()[0] == 1
    reader.close()


def test_another_process_cannot_use_the_file_while_the_store_holds_it(store):
    plans.insert_plan_sync(store, "m_1", "t", None, False, "{}")
    reader = sqlite3.connect(store.path, timeout=0.1)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        reader.execute("SELECT count(*) FROM plans").fetchone()
    reader.close()
    code = (
        "import sys; from app.storage.db import Store, StoreUnusable\n"
        "try:\n    Store(sys.argv[1], busy_timeout_ms=100).open()\n"
        "except StoreUnusable as err:\n    print(err); sys.exit(3)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(store.path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[3],
        check=False,
    )
    assert done.returncode == 3, done.stderr
    assert "in use by another process" in done.stdout


@pytest.fixture
def chattr(tmp_path):
    """``chattr`` that works here (root on ext4/xfs/btrfs); flags lifted at teardown."""
    probe = tmp_path / "probe"
    probe.write_text("x")
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed: the immutable-WAL fault needs it")
    done = subprocess.run(["chattr", "+i", str(probe)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"chattr +i does not work here: {done.stderr}")
    subprocess.run(["chattr", "-i", str(probe)], check=True)
    held: list[str] = []

    def flag(sign: str, path: Path) -> None:
        subprocess.run(["chattr", f"{sign}i", str(path)], check=True)
        held.append(str(path))

    yield flag
    for path in held:
        subprocess.run(["chattr", "-i", path], check=False)


def test_an_unwritable_wal_is_storage_unavailable_until_a_write_succeeds(
    store, chattr, monkeypatch
):
    from app.storage import db as store_module

    monkeypatch.setattr(store_module, "PROBE_INTERVAL_S", 0.0)
    plans.insert_plan_sync(store, "m_1", "t", None, False, '{"id":"m_1"}')
    assert store.health() is None
    wal = Path(f"{store.path}-wal")
    chattr("+", wal)
    with pytest.raises(StorageUnavailable) as refused:
        plans.insert_plan_sync(store, "m_2", "t", None, False, "{}")
    assert refused.value.status == 503 and "Retry-After" in refused.value.headers
    fault = store.fault
    assert fault is not None and fault.kind == "unavailable" and "IOERR" in fault.reason

    # Every write path answers alike: a group commit of several writes, a session.
    async def grouped():
        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(_push_refused, store, i)

    anyio.run(grouped)
    with pytest.raises(StorageUnavailable):
        anyio.run(sessions.insert_session, store, "s_1", "m_1", "t", "{}")
    # A transaction that writes nothing proves nothing: the fault stays.
    assert anyio.run(plans.delete_plan, store, "m_missing") is False
    assert store.fault is not None
    assert store.health() is not None  # the probe fails too
    checked = store.fault.checked_at
    assert store.health().checked_at > checked
    assert anyio.run(plans.get_plan, store, "m_1") == '{"id":"m_1"}'  # reads still work
    chattr("-", wal)
    assert store.health() is None  # the probe write succeeds: the fault is over
    plans.insert_plan_sync(store, "m_3", "t", None, False, "{}")
    # A constraint violation is the caller's error, not a storage fault.
    with pytest.raises(Conflict):
        plans.insert_plan_sync(store, "m_3", "t", None, False, "{}")
    assert store.fault is None
    bodies, total = anyio.run(plans.list_plans, store, 10, 0)
    assert total == 2 and anyio.run(plans.get_plan, store, "m_2") is None


async def _push_refused(store, step):
    with pytest.raises(StorageUnavailable):
        await store.write_grouped(
            lambda c: store_jobs.push(c, "j", [_point(step, "{}")], "t", _no_merge)
        )
