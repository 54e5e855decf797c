"""The store's engines, picked by the database setting: the one module that knows both."""

from __future__ import annotations

from pathlib import Path

from app.core.database_url import is_postgres_url
from app.storage.db import SQLiteStore
from app.storage.postgres import READ_POOL, PostgresStore
from app.storage.store import Store


def store_at(location: str | Path, *, read_pool: int = READ_POOL) -> Store:
    """The store at ``location`` (not opened yet): a :class:`PostgresStore` (reading on at
    most ``read_pool`` connections) for a PostgreSQL URL, else the SQLite file's
    :class:`SQLiteStore`."""
    if is_postgres_url(location):
        return PostgresStore(str(location), read_pool=read_pool)
    return SQLiteStore(location)
