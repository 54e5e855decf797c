"""Persistence: plans, job metric points and session metadata in one SQLite file.

Durability: the database runs in WAL mode with ``synchronous=FULL``, so every commit
fsyncs the WAL before ``commit()`` returns. The service answers 2xx only after the
commit, hence an acknowledged write survives a ``kill -9`` of the service *and* a power
loss or OS crash. (``NORMAL`` with WAL would survive a process kill too, but may lose the
last transactions on power loss, which contradicts "2xx means durable"; one fsync per
write is cheap at this service's write rate.)

Concurrency: one connection, guarded by a lock, used from worker threads. Every public
coroutine runs its blocking sqlite call through ``anyio.to_thread.run_sync`` so the event
loop never blocks on disk; the lock serialises statements (SQLite serialises writers
anyway), and ``busy_timeout`` covers a second process opening the same file.

Bodies (plan JSON, reduced metrics) are stored as the exact JSON text the API answered,
so a read returns byte-identical JSON without re-serialising.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import anyio.to_thread

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS plans (
    id          TEXT PRIMARY KEY,
    created_at  TEXT NOT NULL,
    name        TEXT,
    live        INTEGER NOT NULL DEFAULT 0,
    body        TEXT NOT NULL,
    summary     TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS job_points (
    job         TEXT NOT NULL,
    step        INTEGER NOT NULL,
    reduced     TEXT NOT NULL,
    received_at TEXT NOT NULL,
    PRIMARY KEY (job, step)
);
CREATE TABLE IF NOT EXISTS sessions (
    id          TEXT PRIMARY KEY,
    mesh_id     TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    body        TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_by_mesh ON sessions (mesh_id);
"""


@dataclass(frozen=True)
class JobPoint:
    """One stored step of a job: ``reduced`` is the JSON text of the reduced values."""

    step: int
    reduced: str
    received_at: str


class StoreClosed(RuntimeError):
    """The store was used before ``open()`` or after ``close()``."""


class Store:
    """The service's SQLite database. ``open()`` creates the file and the schema."""

    def __init__(self, path: Path | str, *, busy_timeout_ms: int = 5000):
        self.path = Path(path)
        self.busy_timeout_ms = busy_timeout_ms
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------ lifecycle

    @property
    def is_open(self) -> bool:
        return self._conn is not None

    def open(self) -> None:
        """Opens (creating if needed) the database and its schema. Idempotent."""
        if self._conn is not None:
            return
        if str(self.path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            str(self.path), check_same_thread=False, isolation_level=None, timeout=30
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(self.path) != ":memory:" and mode.lower() != "wal":
                raise RuntimeError(f"SQLite refused WAL mode for {self.path} (got {mode!r})")
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
            conn.executescript(SCHEMA)
        except Exception:
            conn.close()
            raise
        self._conn = conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def ping(self) -> bool:
        """True when a trivial query succeeds (readiness)."""
        try:
            self._run(lambda c: c.execute("SELECT 1").fetchone())
        except Exception:
            return False
        return True

    # ------------------------------------------------------------------------ plumbing

    def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            if self._conn is None:
                raise StoreClosed("the store is not open")
            return fn(self._conn)

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Runs ``fn`` in one transaction; returns after the durable commit."""

        def tx(conn: sqlite3.Connection) -> T:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
                conn.execute("COMMIT")
            except BaseException:
                # Also after a failed COMMIT (disk full, I/O error): never leave the shared
                # connection inside a transaction.
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return result

        return self._run(tx)

    async def _in_thread(self, fn: Callable[[], T]) -> T:
        return await anyio.to_thread.run_sync(fn)

    # ---------------------------------------------------------------------------- plans

    def insert_plan_sync(
        self,
        plan_id: str,
        created_at: str,
        name: str | None,
        live: bool,
        body: str,
        summary: str | None = None,
    ) -> None:
        """Stores a plan: its full JSON text and a summary (without per-device fields)."""
        self._write(
            lambda c: c.execute(
                "INSERT INTO plans (id, created_at, name, live, body, summary) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (plan_id, created_at, name, int(live), body, body if summary is None else summary),
            )
        )

    async def insert_plan(
        self,
        plan_id: str,
        created_at: str,
        name: str | None,
        live: bool,
        body: str,
        summary: str | None = None,
    ) -> None:
        await self._in_thread(
            lambda: self.insert_plan_sync(plan_id, created_at, name, live, body, summary)
        )

    async def get_plan(self, plan_id: str) -> str | None:
        """The stored plan JSON text, or None."""

        def read(c: sqlite3.Connection) -> str | None:
            row = c.execute("SELECT body FROM plans WHERE id = ?", (plan_id,)).fetchone()
            return None if row is None else row[0]

        return await self._in_thread(lambda: self._run(read))

    async def list_plans(
        self, limit: int, offset: int, *, summary: bool = False
    ) -> tuple[list[str], int]:
        """Plan JSON texts (or summaries), newest first (insertion order), and the total."""
        column = "summary" if summary else "body"

        def read(c: sqlite3.Connection) -> tuple[list[str], int]:
            total = c.execute("SELECT COUNT(*) FROM plans").fetchone()[0]
            rows = c.execute(
                f"SELECT {column} FROM plans ORDER BY rowid DESC LIMIT ? OFFSET ?", (limit, offset)
            ).fetchall()
            return [row[0] for row in rows], int(total)

        return await self._in_thread(lambda: self._run(read))

    async def delete_plan(self, plan_id: str) -> bool:
        """Deletes a plan; False when there was none."""

        def delete(c: sqlite3.Connection) -> bool:
            return c.execute("DELETE FROM plans WHERE id = ?", (plan_id,)).rowcount > 0

        return await self._in_thread(lambda: self._write(delete))

    # ----------------------------------------------------------------------- job points

    async def put_job_point(self, job: str, step: int, reduced: str, received_at: str) -> bool:
        """Stores (or replaces) one step of a job. Returns True when the step was new."""

        def put(c: sqlite3.Connection) -> bool:
            existed = c.execute(
                "SELECT 1 FROM job_points WHERE job = ? AND step = ?", (job, step)
            ).fetchone()
            c.execute(
                "INSERT INTO job_points (job, step, reduced, received_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (job, step) DO UPDATE SET "
                "reduced = excluded.reduced, received_at = excluded.received_at",
                (job, step, reduced, received_at),
            )
            return existed is None

        return await self._in_thread(lambda: self._write(put))

    async def job_points(self, job: str) -> list[JobPoint]:
        """Every stored step of ``job`` in step order."""

        def read(c: sqlite3.Connection) -> list[JobPoint]:
            rows = c.execute(
                "SELECT step, reduced, received_at FROM job_points WHERE job = ? ORDER BY step",
                (job,),
            ).fetchall()
            return [JobPoint(int(s), r, t) for s, r, t in rows]

        return await self._in_thread(lambda: self._run(read))

    # ------------------------------------------------------------------------- sessions

    async def insert_session(self, session_id: str, mesh_id: str, created_at: str, body: str):
        await self._in_thread(
            lambda: self._write(
                lambda c: c.execute(
                    "INSERT INTO sessions (id, mesh_id, created_at, body) VALUES (?, ?, ?, ?)",
                    (session_id, mesh_id, created_at, body),
                )
            )
        )

    async def update_session(self, session_id: str, body: str) -> bool:
        def update(c: sqlite3.Connection) -> bool:
            cur = c.execute("UPDATE sessions SET body = ? WHERE id = ?", (body, session_id))
            return cur.rowcount > 0

        return await self._in_thread(lambda: self._write(update))

    async def get_session(self, session_id: str) -> str | None:
        def read(c: sqlite3.Connection) -> str | None:
            row = c.execute("SELECT body FROM sessions WHERE id = ?", (session_id,)).fetchone()
            return None if row is None else row[0]

        return await self._in_thread(lambda: self._run(read))

    async def delete_session(self, session_id: str) -> bool:
        def delete(c: sqlite3.Connection) -> bool:
            return c.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount > 0

        return await self._in_thread(lambda: self._write(delete))
