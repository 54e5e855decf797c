"""The sessions table: round trips, and pages newest first, of all or of one plan."""

from __future__ import annotations

import anyio
import pytest

from app.storage import sessions
from app.storage.db import Store
from app.storage.errors import Conflict


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "sub" / "db.sqlite")
    s.open()
    yield s
    s.close()


def test_sessions_table(store):
    async def main():
        await sessions.insert_session(store, "s_1", "m_1", "t", '{"step":0}')
        assert await sessions.update_session(store, "s_1", '{"step":3}') is True
        assert await sessions.get_session(store, "s_1") == '{"step":3}'
        assert await sessions.delete_session(store, "s_1") is True
        assert await sessions.update_session(store, "s_1", "{}") is False

    anyio.run(main)


def test_sessions_are_listed_newest_first_of_all_plans_or_of_one(store):
    async def main():
        for i, mesh in enumerate(["m_a", "m_b", "m_a", "m_a"]):
            await sessions.insert_session(store, f"s_{i}", mesh, "t", f'{{"i":{i}}}')
        assert await sessions.list_sessions(store, 2, 0) == (['{"i":3}', '{"i":2}'], 4)
        assert await sessions.list_sessions(store, 10, 1, "m_a") == (['{"i":2}', '{"i":0}'], 3)
        assert await sessions.list_sessions(store, 10, 0, "m_none") == ([], 0)
        assert await sessions.get_session(store, "s_missing") is None
        assert await sessions.delete_session(store, "s_missing") is False
        with pytest.raises(Conflict):  # an id is taken once
            await sessions.insert_session(store, "s_1", "m_a", "t", "{}")
        assert await sessions.get_session(store, "s_1") == '{"i":1}'

    anyio.run(main)
