"""The calibrations table (app.storage.calibrations): a profile stored once, read back by
id, listed newest first; an id is never written twice. Issue 58, class 6 and 7, on both
engines (SQLite and a real PostgreSQL): pages with their total, deletes that keep a
running host profile, retention that keeps the newest, and one host calibration at a
time, atomically, replicas racing included."""

from __future__ import annotations

import threading

import anyio
import orjson
import pytest

from app.storage import calibrations, owners
from app.storage.db import Store
from app.storage.errors import Conflict
from app.storage.postgres import PostgresStore
from app.storage.store import Statement


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "cal.sqlite")
    s.open()
    yield s
    s.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request, tmp_path):
    """A store of each engine (PostgreSQL: a fresh database on the tests' server)."""
    if request.param == "sqlite":
        s = Store(tmp_path / "cal.sqlite")
    else:
        s = PostgresStore(request.getfixturevalue("postgres_url"))
    s.open()
    yield s
    s.close()


def test_profiles_round_trip_newest_first(store):
    for i, stamp in enumerate(
        ("2026-12-06T00:00:01Z", "2026-12-06T00:00:03Z", "2026-12-06T00:00:02Z")
    ):
        anyio.run(calibrations.insert_profile, store, f"jobs-{i}", stamp, "jobs", "tpu", None,
                  f'{{"id": "jobs-{i}"}}')  # fmt: skip
    assert anyio.run(calibrations.get_profile, store, "jobs-1") == '{"id": "jobs-1"}'
    assert anyio.run(calibrations.get_profile, store, "nope") is None
    listed = anyio.run(calibrations.list_profiles, store)
    assert listed == ['{"id": "jobs-1"}', '{"id": "jobs-2"}', '{"id": "jobs-0"}']
    assert anyio.run(calibrations.list_profiles, store, 1) == ['{"id": "jobs-1"}']
    with pytest.raises(Conflict):
        anyio.run(calibrations.insert_profile, store, "jobs-0", "x", "jobs", "tpu", None, "{}")


def _body(pid: str, kind: str = "jobs", status: str = "done") -> str:
    return orjson.dumps({"id": pid, "kind": kind, "status": status}).decode()


def _jobs(store, n: int, keep: int | None = None, start: int = 0) -> None:
    for i in range(start, start + n):
        anyio.run(lambda i=i: calibrations.insert_profile(
            store, f"jobs-{i:03d}", f"2026-12-06T00:{i // 60:02d}:{i % 60:02d}Z", "jobs", "tpu",
            None, _body(f"jobs-{i:03d}"), keep=keep))  # fmt: skip


def _ids(store) -> list[str]:
    return [orjson.loads(t)["id"] for t in anyio.run(calibrations.list_profiles, store, 10**6)]


def test_pages_of_profiles_say_how_many_there_are(engine):
    _jobs(engine, 1005)  # past 1,000: the list once stopped there, silently
    first, total = anyio.run(calibrations.page_profiles, engine, 1000, 0)
    rest, again = anyio.run(calibrations.page_profiles, engine, 1000, 1000)
    assert total == again == 1005 and len(first) == 1000 and len(rest) == 5
    ids = [orjson.loads(t)["id"] for t in first + rest]
    assert ids == [f"jobs-{i:03d}" for i in range(1004, -1, -1)]
    assert anyio.run(calibrations.page_profiles, engine, 10, 2000) == ([], 1005)


def test_retention_keeps_the_newest_and_what_plans_and_measuring_need(engine):
    # a running host profile (measuring) and the newest done host profile of each device
    # kind (the default of plans on those devices) stay whatever their age
    for pid, stamp, status, device in (
        ("host-old", "2026-12-05T00:00:00Z", "done", "cpu"),
        ("host-cpu", "2026-12-05T00:00:01Z", "done", "cpu"),
        ("host-tpu", "2026-12-05T00:00:02Z", "done", "TPU v5 lite"),
        ("host-cut", "2026-12-05T00:00:03Z", "failed", "cpu"),
        ("host-run", "2026-12-05T00:00:04Z", "running", "cpu"),
    ):
        anyio.run(calibrations.insert_profile, engine, pid, stamp, "host", "cpu", device,
                  _body(pid, "host", status))  # fmt: skip
    _jobs(engine, 6, keep=4)
    assert _ids(engine) == ["jobs-005", "jobs-004", "jobs-003", "jobs-002", "host-run",
                            "host-tpu", "host-cpu"]  # fmt: skip
    _jobs(engine, 1, keep=2, start=6)  # a smaller keep takes effect at the next store
    assert _ids(engine) == ["jobs-006", "jobs-005", "host-run", "host-tpu", "host-cpu"]


def _claim(store, pid: str, owner: int) -> None:
    sql = Statement(
        "UPDATE work_owners SET owner = ? WHERE kind = ? AND id = ?",
        "UPDATE work_owners SET owner = %s WHERE kind = %s AND id = %s",
    )
    store.write_here(lambda c: c.execute(sql, (owner, owners.CALIBRATION, pid)))


def _start(store, pid: str) -> str | None:
    return anyio.run(lambda: calibrations.start_host_profile(
        store, pid, f"2026-12-06T00:00:00.{pid[-1]}Z", "cpu", "cpu",
        _body(pid, "host", "running"), keep=10))  # fmt: skip


def test_one_host_calibration_at_a_time_and_deletes_spare_a_measuring_one(engine):
    assert _start(engine, "host-1") is None
    assert _start(engine, "host-2") == "host-1"  # refused: nothing stored
    assert anyio.run(calibrations.get_profile, engine, "host-2") is None
    assert anyio.run(calibrations.delete_profile, engine, "host-1") == "running"
    _jobs(engine, 1)
    assert anyio.run(calibrations.delete_profile, engine, "jobs-000") == "deleted"
    assert anyio.run(calibrations.delete_profile, engine, "jobs-000") == "missing"
    assert _ids(engine) == ["host-1"]
    # its process stopped: no longer measuring, so another may start, and it may go
    _claim(engine, "host-1", 777)
    assert _start(engine, "host-2") is None
    assert anyio.run(calibrations.delete_profile, engine, "host-1") == "deleted"
    anyio.run(calibrations.update_profile, engine, "host-2", _body("host-2", "host", "done"))
    assert _start(engine, "host-3") is None  # the one before ended


def test_replicas_starting_at_once_store_one_host_calibration(postgres_url):
    # two service processes on one PostgreSQL, four starts at once: the check and the
    # insert are one serializable transaction, so exactly one is stored
    replicas = [PostgresStore(postgres_url) for _ in range(2)]
    for replica in replicas:
        replica.open()
    try:
        barrier = threading.Barrier(4)
        answers: dict[str, str | None] = {}

        def start(store, pid: str) -> None:
            barrier.wait()
            answers[pid] = _start(store, pid)

        threads = [threading.Thread(target=start, args=(replicas[i % 2], f"host-{i}"))
                   for i in range(4)]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        stored = [pid for pid, running in answers.items() if running is None]
        assert len(answers) == 4 and len(stored) == 1, answers
        assert {running for running in answers.values() if running} == set(stored)
        assert _ids(replicas[1]) == stored
    finally:
        for replica in replicas:
            replica.close()
