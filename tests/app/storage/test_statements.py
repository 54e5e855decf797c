"""Each engine's own SQL (app/storage/store.py ``Statement``, app/storage/postgres_schema.py):
every statement a table module states exists in both dialects and says the same in each,
and both engines hold the same tables. The statements run on a real PostgreSQL in
tests/app/storage/test_postgres.py and on SQLite everywhere."""

from __future__ import annotations

import importlib
import pkgutil
import re
import sqlite3

import psycopg
import pytest

import app.storage
from app.storage.db import SQLiteStore
from app.storage.migrations import COMPILE_CHECKS_SCHEMA
from app.storage.postgres import PostgresStore
from app.storage.rollups import ROLLUP_UPSERT
from app.storage.spreads import SPREAD_UPSERT
from app.storage.store import Statement


def _stated() -> dict[str, Statement]:
    """Every module-level :class:`Statement` of the storage package, by its name."""
    found = {}
    for module in pkgutil.iter_modules(app.storage.__path__):
        loaded = importlib.import_module(f"app.storage.{module.name}")
        for name, value in vars(loaded).items():
            if isinstance(value, Statement):
                found[f"{module.name}.{name}"] = value
    return found


STATED = _stated()


def _outside_quotes(sql: str) -> str:
    return re.sub(r"'[^']*'", "''", sql)


def test_the_package_states_its_statements():
    assert {"rollups.ROLLUP_UPSERT", "spreads.SPREAD_UPSERT", "plans._INSERT"} <= set(STATED)


@pytest.mark.parametrize("name", sorted(STATED))
def test_each_statement_takes_the_same_parameters_in_both_dialects(name):
    statement = STATED[name]
    sqlite, postgres = _outside_quotes(statement.sqlite), _outside_quotes(statement.postgres)
    assert "%s" not in sqlite and "?" not in postgres
    assert sqlite.count("?") == postgres.count("%s")
    assert "%" not in postgres.replace("%s", "").replace("%%", "")  # a literal % is doubled
    assert not re.search(r"\b(min|max)\s*\([^()]*,", postgres)  # least/greatest there
    if statement.many is not None:  # one array a parameter of the row, keys among them
        arrays = statement.many
        assert arrays.sql.count("%b::") == len(arrays.types) == sqlite.count("?")
        assert all(0 <= key < len(arrays.types) for key in arrays.keys)
        assert "unnest(" in arrays.sql and "?" not in arrays.sql


def test_the_upserts_mean_the_same_in_sqlite():
    conn = sqlite3.connect(":memory:")
    conn.execute(
        "CREATE TABLE job_rollups (job, level, metric, block, n, total, low, high, "
        "last_step, last, PRIMARY KEY (job, level, metric, block))"
    )
    conn.execute(ROLLUP_UPSERT.sqlite, ("j", 0, "m", 0, 1, 2.0, None, 5.0, 3, 1.0))
    conn.execute(ROLLUP_UPSERT.sqlite, ("j", 0, "m", 0, 2, 1.0, 1.0, 4.0, 7, 9.0))
    assert conn.execute("SELECT n, total, low, high, last_step, last FROM job_rollups").fetchone() \
        == (3, 3.0, 1.0, 5.0, 7, 9.0)  # fmt: skip
    assert "least(job_rollups.low, excluded.low)" in ROLLUP_UPSERT.postgres
    assert "greatest(b.high, excluded.high)" in SPREAD_UPSERT.postgres
    assert ROLLUP_UPSERT.many is not None and ROLLUP_UPSERT.many.keys == (0, 1, 2, 3)


_PG_TYPES = {"INTEGER": "bigint", "REAL": "double precision", "TEXT": "text", "BLOB": "bytea"}
_BYTES_IN_TEXT = {("plans", "body")}  # SQLite's TEXT column holds bytes too (plans.py)


def test_both_engines_hold_the_same_tables_and_columns(postgres_url):
    sqlite = SQLiteStore(":memory:")
    sqlite.open()
    try:
        raw = sqlite._conn
        raw.executescript(COMPILE_CHECKS_SCHEMA)
        tables = [r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        want = {
            (table, column): _PG_TYPES[declared.upper()]
            for table in tables
            for _, column, declared, *_ in raw.execute(f"PRAGMA table_info({table})")
        }
    finally:
        sqlite.close()
    for key in _BYTES_IN_TEXT:
        want[key] = "bytea"
    store = PostgresStore(postgres_url)
    store.open()
    store.close()
    with psycopg.connect(postgres_url) as conn:
        got = {
            (table, column): data_type
            for table, column, data_type in conn.execute(
                "SELECT table_name, column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND table_name != 'datarax_schema'"
            )
            if column != "rowid"  # SQLite's implicit one, stated in PostgreSQL
        }
        collations = {
            row[0]
            for row in conn.execute(
                "SELECT DISTINCT collation_name FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND data_type = 'text' "
                "AND table_name != 'datarax_schema'"
            )
        }
    assert got == want
    assert collations == {"C"}  # byte order, as SQLite sorts
