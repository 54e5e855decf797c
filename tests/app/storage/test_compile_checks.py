"""The compile-check tables: checks stored and updated, pages per plan, the result cache,
the checks a previous process left unfinished, and the handle that shares the file."""

from __future__ import annotations

import anyio
import pytest

from app.storage import compile_checks as stored
from app.storage import owners, plans
from app.storage.compile_checks import CompileStore
from app.storage.db import Store


def _check(cid: str, mesh: str = "m_1", status: str = "queued", **extra) -> dict:
    return {"id": cid, "mesh_id": mesh, "created_at": "t", "status": status, **extra}


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "db.sqlite")
    s.open()
    stored.create_tables(s)
    yield s
    s.close()


def test_checks_are_stored_rewritten_and_paged_per_plan_newest_first(store):
    async def main():
        for cid, mesh in [("c_1", "m_1"), ("c_2", "m_2"), ("c_3", "m_1"), ("c_4", "m_1")]:
            await stored.put_check(store, _check(cid, mesh))
        await stored.put_check(store, _check("c_3", status="compiling", phase="lowering"))
        assert await stored.get_check(store, "c_3") == _check(
            "c_3", status="compiling", phase="lowering"
        )
        assert await stored.get_check(store, "c_missing") is None
        items, total = await stored.list_checks(store, "m_1", 2, 0)
        assert [c["id"] for c in items] == ["c_4", "c_3"] and total == 3
        items, total = await stored.list_checks(store, "m_1", 2, 2)
        assert [c["id"] for c in items] == ["c_1"] and total == 3
        assert await stored.list_checks(store, "m_none", 5, 0) == ([], 0)

    anyio.run(main)


def test_results_are_cached_by_key_and_replaced(store):
    async def main():
        assert await stored.get_result(store, "k") is None
        await stored.put_result(store, "k", "t1", {"fits": True})
        await stored.put_result(store, "k", "t2", {"fits": False})
        assert await stored.get_result(store, "k") == {"fits": False}

    anyio.run(main)


def test_unfinished_checks_of_a_previous_process_fail_with_the_reason(store, monkeypatch):
    async def main():
        with monkeypatch.context() as previous:  # stored by a process that has stopped
            previous.setattr(owners, "OWNER", 777)
            await stored.put_check(store, _check("c_1", position=2))
            await stored.put_check(store, _check("c_2", status="compiling", phase="compiling"))
            await stored.put_check(store, _check("c_3", status="done", result={"fits": True}))
        await stored.put_check(store, _check("c_4", status="compiling", phase="compiling"))
        assert await stored.fail_unfinished(store, "restarted") == 2
        for cid in ("c_1", "c_2"):
            assert await stored.get_check(store, cid) == _check(
                cid, status="failed", error={"code": "compile_failed", "detail": "restarted"}
            )
        assert (await stored.get_check(store, "c_3"))["status"] == "done"
        assert (await stored.get_check(store, "c_4"))["status"] == "compiling"  # this process's
        assert await stored.fail_unfinished(store, "again") == 0

    anyio.run(main)


def test_the_compile_store_shares_the_services_connection_and_closes_cleanly(tmp_path, monkeypatch):
    path = tmp_path / "db.sqlite"
    service_store = Store(path)
    service_store.open()
    compile_store = CompileStore(path)
    with pytest.raises(RuntimeError, match="not open"):
        anyio.run(compile_store.get_check, "c_1")
    compile_store.open()
    compile_store.open()  # idempotent
    try:
        assert compile_store.store._conn is service_store._conn
        with monkeypatch.context() as previous:  # a check a stopped process left queued
            previous.setattr(owners, "OWNER", 777)
            anyio.run(compile_store.put_check, _check("c_1"))
        anyio.run(compile_store.put_result, "k", "t", {"fits": True})
        assert anyio.run(compile_store.get_check, "c_1") == _check("c_1")
        assert anyio.run(compile_store.list_checks, "m_1", 10, 0) == ([_check("c_1")], 1)
        assert anyio.run(compile_store.get_result, "k") == {"fits": True}
        assert anyio.run(compile_store.fail_unfinished, "why") == 1
        # Closing the compile store leaves the service's store open on the file.
        compile_store.close()
        plans.insert_plan_sync(service_store, "m_1", "t", None, False, "{}")
        assert anyio.run(plans.get_plan, service_store, "m_1") == "{}"
    finally:
        compile_store.close()
        service_store.close()
    reopened = CompileStore(path)  # the tables and rows outlive both
    reopened.open()
    try:
        check = anyio.run(reopened.get_check, "c_1")
        assert check["status"] == "failed" and check["error"]["detail"] == "why"
    finally:
        reopened.close()
