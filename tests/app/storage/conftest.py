"""Stores for the storage tests, on either engine (issue 42).

- ``store``: an opened store, once per engine (ids ``sqlite`` and ``postgres``): the SQLite
  file's :class:`Store` under ``tmp_path``, or a :class:`PostgresStore` on a fresh, empty
  database of the session's PostgreSQL (``postgres_url``, tests/postgres_fixtures.py: it
  skips loudly without PostgreSQL, and fails under CI); closed after the test.
- :func:`statements_sent`: the statements a store sends, on either engine (SQLite's trace
  callback; PostgreSQL's connections through the store's wrapper), to tell how many
  COMMITs a write took or which tables a read touched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.storage import postgres
from app.storage.db import Store
from app.storage.postgres import PostgresStore


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An opened store on each engine in turn; closed after the test."""
    if request.param == "postgres":
        opened: Store = PostgresStore(request.getfixturevalue("postgres_url"))
    else:
        opened = Store(tmp_path / "x.sqlite")
    opened.open()
    yield opened
    opened.close()


@contextlib.contextmanager
def statements_sent(store: Store) -> Iterator[list[str]]:
    """The statements ``store`` sends while the block runs, in the engine's own words.

    SQLite: its trace callback on the store's one connection. PostgreSQL: every statement
    that passes the store's connection wrapper, on the writer and the read pool alike
    (the transactions' ``BEGIN``/``COMMIT`` of writes and group commits among them; a read
    snapshot's own ``BEGIN ... READ ONLY`` and ``ROLLBACK`` do not pass it).
    """
    sent: list[str] = []
    if isinstance(store, PostgresStore):
        execute, executemany = postgres._Connection.execute, postgres._Connection.executemany

        def recorded(self: Any, sql: Any, params: Any = ()) -> Any:
            sent.append(sql if isinstance(sql, str) else sql.postgres)
            return execute(self, sql, params)

        def recorded_many(self: Any, sql: Any, rows: Any) -> Any:
            sent.append(sql if isinstance(sql, str) else sql.postgres)
            return executemany(self, sql, rows)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(postgres._Connection, "execute", recorded)
            patch.setattr(postgres._Connection, "executemany", recorded_many)
            yield sent
        return
    conn = store._conn
    assert conn is not None, "the store is not open"
    conn.set_trace_callback(sent.append)
    try:
        yield sent
    finally:
        conn.set_trace_callback(None)
