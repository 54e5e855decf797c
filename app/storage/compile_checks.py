"""Compile checks and their result cache, in the service's SQLite file (own tables).

Two tables beside :mod:`app.storage.db`'s, in the same database file and through the same
connection (a :class:`~app.storage.db.Store` on the same path shares it: the file is opened in
SQLite's exclusive locking mode, which allows one connection only; storage faults answer
as the store's do):

- ``compile_checks``: one row per check, its JSON as last answered (terminal states are
  written once; queued/compiling ones are rewritten as they change);
- ``compile_results``: XLA's figures by cache key (everything that changes the program,
  plus the jax and libtpu versions), so a repeat check answers at once.

Every call runs its blocking sqlite work in a worker thread.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from app.storage.db import Store
from app.storage.migrations import COMPILE_CHECKS_SCHEMA

T = TypeVar("T")


UNFINISHED = ("queued", "compiling")


class CompileStore:
    """The two tables; ``open()`` creates them."""

    def __init__(self, path: Path | str):
        self.path = str(path)
        self._store: Store | None = None

    def open(self) -> None:
        if self._store is not None:
            return
        store = Store(self.path)
        store.open()
        try:
            store.execute_here(lambda c: c.executescript(COMPILE_CHECKS_SCHEMA))
        except BaseException:
            store.close()
            raise
        self._store = store

    def close(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            store.close()

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._store is None:
            raise RuntimeError("the compile store is not open")
        return await self._store.execute(fn)

    async def fail_unfinished(self, reason: str) -> int:
        """Marks checks a previous service process left queued or compiling as failed."""

        def fix(conn: sqlite3.Connection) -> int:
            rows = conn.execute(
                "SELECT id, body FROM compile_checks WHERE status IN (?, ?)", UNFINISHED
            ).fetchall()
            for cid, body in rows:
                check = json.loads(body)
                check.update(status="failed", error={"code": "compile_failed", "detail": reason})
                check.pop("position", None)
                check.pop("phase", None)
                conn.execute(
                    "UPDATE compile_checks SET status = 'failed', body = ? WHERE id = ?",
                    (json.dumps(check), cid),
                )
            return len(rows)

        return await self._run(fix)

    async def put_check(self, check: dict[str, Any]) -> None:
        text = json.dumps(check)
        await self._run(
            lambda c: c.execute(
                "INSERT INTO compile_checks (id, mesh_id, created_at, status, body) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
                "status = excluded.status, body = excluded.body",
                (check["id"], check["mesh_id"], check["created_at"], check["status"], text),
            )
        )

    async def get_check(self, cid: str) -> dict[str, Any] | None:
        row = await self._run(
            lambda c: c.execute("SELECT body FROM compile_checks WHERE id = ?", (cid,)).fetchone()
        )
        return None if row is None else json.loads(row[0])

    async def list_checks(self, mesh_id: str, limit: int, offset: int) -> tuple[list[dict], int]:
        def read(conn: sqlite3.Connection) -> tuple[list[dict], int]:
            rows = conn.execute(
                "SELECT body FROM compile_checks WHERE mesh_id = ? ORDER BY id DESC "
                "LIMIT ? OFFSET ?",
                (mesh_id, limit, offset),
            ).fetchall()
            total = conn.execute(
                "SELECT count(*) FROM compile_checks WHERE mesh_id = ?", (mesh_id,)
            ).fetchone()[0]
            return [json.loads(r[0]) for r in rows], int(total)

        return await self._run(read)

    async def get_result(self, key: str) -> dict[str, Any] | None:
        row = await self._run(
            lambda c: c.execute(
                "SELECT result FROM compile_results WHERE key = ?", (key,)
            ).fetchone()
        )
        return None if row is None else json.loads(row[0])

    async def put_result(self, key: str, created_at: str, result: dict[str, Any]) -> None:
        text = json.dumps(result)
        await self._run(
            lambda c: c.execute(
                "INSERT OR REPLACE INTO compile_results (key, created_at, result) VALUES (?, ?, ?)",
                (key, created_at, text),
            )
        )
