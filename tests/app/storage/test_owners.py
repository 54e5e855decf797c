"""Unfinished work and its owner (app/storage/owners.py): a starting process fails what a
stopped one left (compile checks, host calibrations), never what a live replica on the
same PostgreSQL database is doing; on SQLite, as before, whatever another process left."""

from __future__ import annotations

import time

import anyio
import orjson
import psycopg
import pytest

from app.storage import calibrations, compile_checks, owners, sessions
from app.storage.db import Store
from app.storage.postgres import PostgresStore
from app.storage.store import Statement

REPLICA = 12345  # the owner key of a replica simulated by a connection holding its lock


def _check(cid: str, status: str) -> dict:
    return {"id": cid, "mesh_id": "m", "created_at": "2026-12-06T00:00:00Z", "status": status}


def _profile(pid: str, status: str) -> str:
    return orjson.dumps({"id": pid, "status": status}).decode()


def _statuses(store) -> dict[str, str]:
    return {
        c["id"]: c["status"] for c in anyio.run(compile_checks.list_checks, store, "m", 100, 0)[0]
    }


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = Store(tmp_path / "owners.sqlite")
    else:
        s = PostgresStore(request.getfixturevalue("postgres_url"))
    s.open()
    compile_checks.create_tables(s)
    yield s
    s.close()


def _until_gone(store, owner: int) -> None:
    """Waits (bounded) until ``owner``'s lock is released: a closed connection's backend
    ends, and lets its locks go, a moment after the client closed it."""
    deadline = time.monotonic() + 30
    while owner in store.execute_here(store.live_owners):
        assert time.monotonic() < deadline, f"owner {owner} still holds its lock"
        time.sleep(0.05)


def _set_owner(store, kind: str, item_id: str, owner: int) -> None:
    sql = Statement(
        "UPDATE work_owners SET owner = ? WHERE kind = ? AND id = ?",
        "UPDATE work_owners SET owner = %s WHERE kind = %s AND id = %s",
    )
    store.write_here(lambda c: c.execute(sql, (owner, kind, item_id)))


def test_work_of_this_process_stays_and_of_a_stopped_one_fails(store):
    for cid, status in (("mine", "compiling"), ("gone", "queued"), ("old", "queued")):
        anyio.run(compile_checks.put_check, store, _check(cid, status))
    anyio.run(compile_checks.put_check, store, _check("done", "done"))
    _set_owner(store, owners.COMPILE_CHECK, "gone", 777)  # a process that stopped
    store.write_here(lambda c: owners.release(c, owners.COMPILE_CHECK, "old"))  # no owner row
    assert anyio.run(compile_checks.fail_unfinished, store, "restarted") == 2
    assert _statuses(store) == {"mine": "compiling", "gone": "failed", "old": "failed",
                                "done": "done"}  # fmt: skip
    # ended work keeps no owner row
    left = store.execute_here(lambda c: c.execute("SELECT kind, id FROM work_owners").fetchall())
    assert left == [(owners.COMPILE_CHECK, "mine")]


def test_a_live_replicas_work_stays_until_it_stops(postgres_url):
    store = PostgresStore(postgres_url)
    store.open()
    compile_checks.create_tables(store)
    replica = psycopg.connect(postgres_url, autocommit=True)
    try:
        replica.execute("SELECT pg_advisory_lock_shared(%s, %s)", (owners.OWNER_CLASS, REPLICA))
        assert REPLICA in store.execute_here(store.live_owners)
        anyio.run(compile_checks.put_check, store, _check("theirs", "compiling"))
        _set_owner(store, owners.COMPILE_CHECK, "theirs", REPLICA)
        body = _profile("cal", "running")
        anyio.run(calibrations.insert_profile, store, "cal", "t", "host", "cpu", "cpu", body)
        _set_owner(store, owners.CALIBRATION, "cal", REPLICA)
        assert anyio.run(compile_checks.fail_unfinished, store, "restarted") == 0
        assert anyio.run(calibrations.running_profiles, store) == []
        replica.close()  # the replica stops (its connection, and so its lock, goes)
        _until_gone(store, REPLICA)
        assert anyio.run(compile_checks.fail_unfinished, store, "restarted") == 1
        assert _statuses(store) == {"theirs": "failed"}
        assert anyio.run(calibrations.running_profiles, store) == [body]
    finally:
        replica.close()
        store.close()


def test_a_calibration_owned_while_running_and_released_when_it_ends(store):
    anyio.run(calibrations.insert_profile, store, "c1", "t", "host", "cpu", "cpu",
              _profile("c1", "running"))  # fmt: skip
    assert anyio.run(calibrations.running_profiles, store) == []  # this process measures it
    _set_owner(store, owners.CALIBRATION, "c1", 777)
    assert anyio.run(calibrations.running_profiles, store) == [_profile("c1", "running")]
    anyio.run(calibrations.update_profile, store, "c1", _profile("c1", "failed"))
    rows = store.execute_here(lambda c: c.execute("SELECT count(*) FROM work_owners").fetchone())
    assert rows == (0,)


def test_a_session_created_by_a_live_replica_is_held_elsewhere(postgres_url, monkeypatch):
    store = PostgresStore(postgres_url)
    store.open()
    replica = psycopg.connect(postgres_url, autocommit=True)
    try:
        replica.execute("SELECT pg_advisory_lock_shared(%s, %s)", (owners.OWNER_CLASS, REPLICA))
        with monkeypatch.context() as theirs:
            theirs.setattr(owners, "OWNER", REPLICA)
            anyio.run(sessions.insert_session, store, "s_theirs", "m", "t", "{}")
        anyio.run(sessions.insert_session, store, "s_mine", "m", "t", "{}")
        assert anyio.run(sessions.held_elsewhere, store, "s_theirs")
        assert not anyio.run(sessions.held_elsewhere, store, "s_mine")
        assert not anyio.run(sessions.held_elsewhere, store, "s_none")
        replica.close()  # that replica stopped: its sessions are lost, not elsewhere
        _until_gone(store, REPLICA)
        assert not anyio.run(sessions.held_elsewhere, store, "s_theirs")
        assert anyio.run(sessions.delete_session, store, "s_theirs")
        left = store.execute_here(lambda c: c.execute("SELECT id FROM work_owners").fetchall())
        assert left == [("s_mine",)]
    finally:
        replica.close()
        store.close()


def test_on_sqlite_no_session_is_held_elsewhere(tmp_path, monkeypatch):
    store = Store(tmp_path / "s.sqlite")
    store.open()
    try:
        with monkeypatch.context() as previous:  # a process that has stopped
            previous.setattr(owners, "OWNER", REPLICA)
            anyio.run(sessions.insert_session, store, "s_old", "m", "t", "{}")
        assert not anyio.run(sessions.held_elsewhere, store, "s_old")
    finally:
        store.close()


def _owner_pids(url: str, owner: int) -> set[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND classid::bigint = %s AND objid::bigint = %s AND objsubid = 2",
            (owners.OWNER_CLASS, owner),
        ).fetchall()
    return {int(r[0]) for r in rows}


def test_a_writer_lost_while_idle_takes_its_owner_lock_again_by_itself(postgres_url):
    """The database drops the writer's connection (as a restart does) while nothing
    writes: the store connects again by itself, and with it holds its owner lock."""
    store = PostgresStore(postgres_url)
    store.open()
    try:
        (before,) = _owner_pids(postgres_url, owners.OWNER) & {store._conn.raw.info.backend_pid}
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (before,))
        deadline = time.monotonic() + 60
        while True:  # no request to the store meanwhile
            pids = _owner_pids(postgres_url, owners.OWNER)
            if pids and before not in pids:
                break
            assert time.monotonic() < deadline, "the owner lock was not taken again"
            time.sleep(0.1)
        assert store._conn.raw.info.backend_pid in pids
    finally:
        store.close()


@pytest.mark.parametrize("back", [True, False])
def test_an_owner_that_connects_again_within_the_grace_keeps_its_work(
    postgres_url, monkeypatch, back
):
    """A starting process finds a replica's work without a live owner (the replica lost
    its connection): it waits the grace, then fails the work only if the owner did not
    come back meanwhile."""
    store = PostgresStore(postgres_url)
    store.open()
    compile_checks.create_tables(store)
    replica = psycopg.connect(postgres_url, autocommit=True)
    again: list[psycopg.Connection] = []
    waited: list[float] = []

    async def grace(seconds: float) -> None:  # the replica's keepalive, within the grace
        waited.append(seconds)
        if back:
            conn = psycopg.connect(postgres_url, autocommit=True)
            conn.execute("SELECT pg_advisory_lock_shared(%s, %s)", (owners.OWNER_CLASS, REPLICA))
            again.append(conn)

    monkeypatch.setattr(owners, "sleep", grace)
    try:
        anyio.run(compile_checks.put_check, store, _check("theirs", "compiling"))
        _set_owner(store, owners.COMPILE_CHECK, "theirs", REPLICA)
        replica.close()  # the connection, and so the lock, goes
        _until_gone(store, REPLICA)
        failed = anyio.run(compile_checks.fail_unfinished, store, "restarted")
        assert waited == [store.owner_grace_s]
        assert (failed, _statuses(store)) == (
            (0, {"theirs": "compiling"}) if back else (1, {"theirs": "failed"})
        )
        # nothing orphaned: no wait at all
        waited.clear()
        anyio.run(compile_checks.fail_unfinished, store, "restarted")
        assert waited == []
    finally:
        replica.close()
        for conn in again:
            conn.close()
        store.close()
