"""The store interface (app/storage/store.py, app/storage/errors.py): one interface, one
implementation per engine side by side, each raising the interface's own errors."""

from __future__ import annotations

import ast
import sqlite3
from pathlib import Path

import anyio
import pytest

from app.storage import plans
from app.storage.db import SQLiteStore
from app.storage.errors import Conflict
from app.storage.postgres import PostgresStore
from app.storage.store import Store

STORAGE = Path(__file__).resolve().parents[3] / "app" / "storage"


def test_each_engine_implements_the_interface_and_neither_subclasses_the_other():
    assert issubclass(SQLiteStore, Store) and issubclass(PostgresStore, Store)
    assert not issubclass(PostgresStore, SQLiteStore)
    assert not issubclass(SQLiteStore, PostgresStore)
    with pytest.raises(TypeError):
        Store("nowhere")  # type: ignore[abstract]


def test_a_taken_key_is_the_interfaces_conflict_and_the_store_stays_usable(store):
    plans.insert_plan_sync(store, "m_1", "t", None, False, "{}")
    with pytest.raises(Conflict) as taken:
        plans.insert_plan_sync(store, "m_1", "t", None, False, "{}")
    assert not isinstance(taken.value, sqlite3.Error)
    assert store.fault is None
    plans.insert_plan_sync(store, "m_2", "t", None, False, "{}")
    assert anyio.run(plans.get_plan, store, "m_2") == "{}"


def test_only_the_sqlite_engine_imports_sqlite3():
    # The SQLite engine: its store, its schema and migrations, its space reserve.
    engine = {"db.py", "migrations.py", "reserve.py"}
    importers = set()
    for path in STORAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if "sqlite3" in names or (
                isinstance(node, ast.ImportFrom) and node.module == "sqlite3"
            ):
                importers.add(path.name)
    assert importers <= engine, sorted(importers - engine)
