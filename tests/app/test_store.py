"""The SQLite store: durability settings, round trips, concurrency."""

from __future__ import annotations

import sqlite3
import threading

import anyio
import pytest

from app.store import Store, StoreClosed


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


def test_plans_round_trip_and_order(store):
    async def main():
        for i in range(5):
            await store.insert_plan(
                f"m_{i}", "2026-01-01T00:00:00Z", f"n{i}", i % 2 == 0, f'{{"i":{i}}}'
            )
        bodies, total = await store.list_plans(2, 1)
        assert total == 5 and bodies == ['{"i":3}', '{"i":2}']
        await store.insert_plan("m_s", "t", None, False, '{"big":1}', '{"small":1}')
        assert (await store.list_plans(1, 0, summary=True))[0] == ['{"small":1}']
        assert (await store.list_plans(1, 0))[0] == ['{"big":1}']
        assert await store.get_plan("m_4") == '{"i":4}'
        assert await store.delete_plan("m_4") is True
        assert await store.delete_plan("m_4") is False
        assert await store.get_plan("m_4") is None

    anyio.run(main)


def test_duplicate_plan_id_is_refused(store):
    store.insert_plan_sync("m_1", "t", None, False, "{}")
    with pytest.raises(sqlite3.IntegrityError):
        store.insert_plan_sync("m_1", "t", None, False, "{}")


def test_job_points_upsert_and_order(store):
    async def main():
        assert await store.put_job_point("j", 5, '{"a":1}', "t1") is True
        assert await store.put_job_point("j", 1, '{"a":2}', "t2") is True
        assert await store.put_job_point("j", 5, '{"a":3}', "t3") is False
        assert await store.put_job_point("other", 0, "{}", "t4") is True
        points = await store.job_points("j")
        assert [(p.step, p.reduced, p.received_at) for p in points] == [
            (1, '{"a":2}', "t2"),
            (5, '{"a":3}', "t3"),
        ]

    anyio.run(main)


def test_sessions_table(store):
    async def main():
        await store.insert_session("s_1", "m_1", "t", '{"step":0}')
        assert await store.update_session("s_1", '{"step":3}') is True
        assert await store.get_session("s_1") == '{"step":3}'
        assert await store.delete_session("s_1") is True
        assert await store.update_session("s_1", "{}") is False

    anyio.run(main)


def test_concurrent_writers_from_threads(store):
    errors: list[BaseException] = []

    def writer(t: int) -> None:
        try:
            for i in range(50):
                store.insert_plan_sync(f"m_{t}_{i}", "t", None, False, "{}")
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
                tg.start_soon(store.put_job_point, "j", i, "{}", "t")
                tg.start_soon(store.job_points, "j")
        assert len(await store.job_points("j")) == 40

    anyio.run(main)


def test_reopen_keeps_data(tmp_path):
    path = tmp_path / "db.sqlite"
    first = Store(path)
    first.open()
    first.insert_plan_sync("m_1", "t", "x", True, '{"id":"m_1"}')
    first.close()
    second = Store(path)
    second.open()
    try:
        assert anyio.run(second.get_plan, "m_1") == '{"id":"m_1"}'
    finally:
        second.close()


def test_closed_store_refuses(tmp_path):
    s = Store(tmp_path / "db.sqlite")
    with pytest.raises(StoreClosed):
        s.insert_plan_sync("m", "t", None, False, "{}")
    assert s.ping() is False


def test_failed_write_rolls_back_and_the_store_stays_usable(store):
    def bad(conn):
        conn.execute(
            "INSERT INTO plans (id, created_at, body, summary) VALUES ('m_x', 't', '{}', '{}')"
        )
        raise RuntimeError("fail inside the transaction")

    with pytest.raises(RuntimeError):
        store._write(bad)
    assert anyio.run(store.get_plan, "m_x") is None
    store.insert_plan_sync("m_y", "t", None, False, "{}")
    assert anyio.run(store.get_plan, "m_y") == "{}"
