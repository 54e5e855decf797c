"""Compile checks and their result cache, in the service's SQLite file (own tables).

Two tables beside the others, in the same database file:

- ``compile_checks``: one row per check, its JSON as last answered (terminal states are
  written once; queued/compiling ones are rewritten as they change);
- ``compile_results``: XLA's figures by cache key (everything that changes the program,
  plus the jax and libtpu versions), so a repeat check answers at once.

The typed functions take the :class:`~app.storage.db.Store` first, like every table's.
Their statements stand alone, so each runs in autocommit mode (:meth:`Store.execute`).

Why :class:`CompileStore` opens a second ``Store`` on the file: the compile-check service
(:class:`app.services.compile_checks.CompileChecks`) is built from the settings alone and
opens and closes its tables in its own ``start()``/``stop()``, also in tests that run it
without the app's store. The compile worker is another process, but it never touches the
database: only the HTTP process does. A second ``Store`` on the same file costs nothing:
it shares the first one's connection, lock and fault state (the file is opened in
SQLite's exclusive locking mode, which allows one connection only), so storage faults
answer as the service store's do, and the file closes with the last of them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.storage import owners, postgres_schema
from app.storage.engines import store_at
from app.storage.migrations import COMPILE_CHECKS_SCHEMA
from app.storage.store import Connection, Statement, Store

UNFINISHED = ("queued", "compiling")
"""The states of a check that has not ended."""


COMPILE_TABLES = Statement(COMPILE_CHECKS_SCHEMA, ";\n".join(postgres_schema.COMPILE_CHECKS_SCHEMA))
"""The two tables and their index, each engine's (idempotent)."""


def create_tables(store: Store) -> None:
    """Creates the two tables when missing (blocking: at startup or in a worker thread)."""
    store.execute_here(lambda c: c.executescript(COMPILE_TABLES))


async def fail_unfinished(store: Store, reason: str) -> int:
    """Marks the checks a stopped service process left queued or compiling as failed
    (``compile_failed`` with ``reason``); answers how many. Checks of a process still
    running (a replica on the same PostgreSQL database) stay theirs
    (:mod:`app.storage.owners`)."""

    def unfinished_ids(conn: Connection) -> list[str]:
        sql = Statement(
            "SELECT id FROM compile_checks WHERE status IN (?, ?)",
            "SELECT id FROM compile_checks WHERE status IN (%s, %s)",
        )
        return [str(row[0]) for row in conn.execute(sql, UNFINISHED)]

    await owners.settle(store, owners.COMPILE_CHECK, unfinished_ids)

    def fix(conn: Connection) -> int:
        unfinished = dict(conn.execute(
            Statement(
"SELECT id, body FROM compile_checks WHERE status IN (?, ?)",
"SELECT id, body FROM compile_checks WHERE status IN (%s, %s)",
), UNFINISHED
        ).fetchall())  # fmt: skip
        stale = owners.orphaned(conn, owners.COMPILE_CHECK, unfinished, store.live_owners(conn))
        rows = [(cid, unfinished[cid]) for cid in stale]
        for cid, body in rows:
            check = json.loads(body)
            check.update(status="failed", error={"code": "compile_failed", "detail": reason})
            check.pop("position", None)
            check.pop("phase", None)
            conn.execute(
                Statement(
                    "UPDATE compile_checks SET status = 'failed', body = ? WHERE id = ?",
                    "UPDATE compile_checks SET status = 'failed', body = %s WHERE id = %s",
                ),
                (json.dumps(check), cid),
            )
            owners.release(conn, owners.COMPILE_CHECK, cid)
        return len(rows)

    return await store.execute(fix)


def _upsert_check(conn: Connection, check: dict[str, Any]) -> None:
    conn.execute(
        Statement(
            "INSERT INTO compile_checks (id, mesh_id, created_at, status, body) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
            "status = excluded.status, body = excluded.body",
            "INSERT INTO compile_checks (id, mesh_id, created_at, status, body) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT(id) DO UPDATE SET "
            "status = excluded.status, body = excluded.body",
        ),
        (check["id"], check["mesh_id"], check["created_at"], check["status"], json.dumps(check)),
    )
    if check["status"] in UNFINISHED:
        owners.claim(conn, owners.COMPILE_CHECK, check["id"])
    else:
        owners.release(conn, owners.COMPILE_CHECK, check["id"])


async def put_check(store: Store, check: dict[str, Any]) -> None:
    """Stores a check's JSON, or replaces its status and body when it is stored already."""
    await store.execute(lambda c: _upsert_check(c, check))


async def put_cancelled(store: Store, check: dict[str, Any]) -> None:
    """:func:`put_check` for a check that ``DELETE /v1/compile-checks/{id}`` cancelled: it
    works on a full disk too, as every delete does (:meth:`Store.delete`)."""
    await store.delete(lambda c: _upsert_check(c, check))


async def get_check(store: Store, cid: str) -> dict[str, Any] | None:
    """The check's JSON as last stored, or None."""
    row = await store.execute(
        lambda c: c.execute(
            Statement(
                "SELECT body FROM compile_checks WHERE id = ?",
                "SELECT body FROM compile_checks WHERE id = %s",
            ),
            (cid,),
        ).fetchone()
    )
    return None if row is None else json.loads(row[0])


async def list_checks(
    store: Store, mesh_id: str, limit: int, offset: int
) -> tuple[list[dict[str, Any]], int]:
    """A page of one plan's checks, newest first (ids sort by time), and how many it has."""

    def read(conn: Connection) -> tuple[list[dict[str, Any]], int]:
        rows = conn.execute(
            Statement(
                "SELECT body FROM compile_checks WHERE mesh_id = ? ORDER BY id DESC LIMIT ? "
                "OFFSET ?",
                "SELECT body FROM compile_checks WHERE mesh_id = %s ORDER BY id DESC LIMIT %s "
                "OFFSET %s",
            ),
            (mesh_id, limit, offset),
        ).fetchall()
        total = conn.execute(
            Statement(
                "SELECT count(*) FROM compile_checks WHERE mesh_id = ?",
                "SELECT count(*) FROM compile_checks WHERE mesh_id = %s",
            ),
            (mesh_id,),
        ).fetchone()[0]
        return [json.loads(r[0]) for r in rows], int(total)

    return await store.execute(read)


async def get_result(store: Store, key: str) -> dict[str, Any] | None:
    """The cached compile result of ``key``, or None."""
    row = await store.execute(
        lambda c: c.execute(
            Statement(
                "SELECT result FROM compile_results WHERE key = ?",
                "SELECT result FROM compile_results WHERE key = %s",
            ),
            (key,),
        ).fetchone()
    )
    return None if row is None else json.loads(row[0])


async def put_result(store: Store, key: str, created_at: str, result: dict[str, Any]) -> None:
    """Caches a compile result under ``key`` (replacing one stored before)."""
    row = (key, created_at, json.dumps(result))
    await store.execute(
        lambda c: c.execute(
            Statement(
                "INSERT INTO compile_results (key, created_at, result) VALUES (?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET created_at = excluded.created_at, "
                "result = excluded.result",
                "INSERT INTO compile_results (key, created_at, result) VALUES (%s, %s, %s) "
                "ON CONFLICT (key) DO UPDATE SET created_at = excluded.created_at, "
                "result = excluded.result",
            ),
            row,
        )
    )


class CompileStore:
    """The compile-check service's own :class:`Store` on the file (see the module
    docstring for why it has one); ``open()`` creates the two tables. Its methods are the
    module's functions over that store."""

    def __init__(self, path: Path | str):
        self.path = str(path)
        self._store: Store | None = None

    def open(self) -> None:
        if self._store is not None:
            return
        store = store_at(self.path, read_pool=2)
        store.open()
        try:
            create_tables(store)
        except BaseException:
            store.close()
            raise
        self._store = store

    def close(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            store.close()

    @property
    def store(self) -> Store:
        """The open store.

        Raises:
          RuntimeError: not open (before ``open()`` or after ``close()``).
        """
        if self._store is None:
            raise RuntimeError("the compile store is not open")
        return self._store

    async def fail_unfinished(self, reason: str) -> int:
        return await fail_unfinished(self.store, reason)

    async def put_check(self, check: dict[str, Any]) -> None:
        await put_check(self.store, check)

    async def put_cancelled(self, check: dict[str, Any]) -> None:
        await put_cancelled(self.store, check)

    async def get_check(self, cid: str) -> dict[str, Any] | None:
        return await get_check(self.store, cid)

    async def list_checks(
        self, mesh_id: str, limit: int, offset: int
    ) -> tuple[list[dict[str, Any]], int]:
        return await list_checks(self.store, mesh_id, limit, offset)

    async def get_result(self, key: str) -> dict[str, Any] | None:
        return await get_result(self.store, key)

    async def put_result(self, key: str, created_at: str, result: dict[str, Any]) -> None:
        await put_result(self.store, key, created_at, result)
