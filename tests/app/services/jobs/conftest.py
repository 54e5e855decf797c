"""A store on a fresh file for each test of the jobs services."""

from __future__ import annotations

import pytest

from app.storage.db import Store
from app.storage.postgres import PostgresStore


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    """An opened store on each engine in turn (issue 42: the push, parts, history and
    retention suites run on both); PostgreSQL's is a fresh database of the session's
    server (tests/postgres_fixtures.py)."""
    if request.param == "postgres":
        s = PostgresStore(request.getfixturevalue("postgres_url"))
    else:
        s = Store(tmp_path / "jobs.sqlite")
    s.open()
    yield s
    s.close()
