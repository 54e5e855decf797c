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

import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import anyio.to_thread

from app import store_jobs, store_parts
from app.errors import ServiceError, StorageFull

T = TypeVar("T")

SCHEMA_VERSION = 4
"""``PRAGMA user_version`` of a current file. 1 (written as 0 by SQLite): plans,
``job_points (job, step, reduced, received_at)``, sessions. 2: the job tables of
:mod:`app.store_jobs`. 3: its ``job_pending`` (per incomplete multi-source step). 4:
multi-source parts stored per source and push (``job_segments``, :mod:`app.store_parts`),
replacing ``job_parts`` and ``job_pending``.
``open()`` migrates an older file in place, one transaction per version."""

MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {
    2: store_jobs.migrate_to_v2,
    3: store_jobs.migrate_to_v3,
    4: store_parts.migrate_to_v4,
}
"""version -> the function that brings a file of the version before it up to it."""

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


def _is_disk_full(err: sqlite3.Error) -> bool:
    """SQLITE_FULL (13), or the I/O error some file systems give for ENOSPC instead."""
    code = getattr(err, "sqlite_errorcode", None)
    return code == sqlite3.SQLITE_FULL or "disk is full" in str(err)


class StoreClosed(RuntimeError):
    """The store was used before ``open()`` or after ``close()``."""


class StoreUnusable(RuntimeError):
    """The database file exists but SQLite cannot use it (corrupt, truncated, not a
    database, unreadable). The file is left exactly as it was."""


MAX_GROUP = 64
"""Most writes one group commit takes (:meth:`Store.write_grouped`)."""


class _GroupedWrite:
    """One caller's write waiting for a group commit, and its outcome."""

    __slots__ = ("error", "finished", "fn", "result")

    def __init__(self, fn: Callable[[sqlite3.Connection], object]) -> None:
        self.fn = fn
        self.result: object = None
        self.error: BaseException | None = None
        self.finished = False

    def finish(self, *, result: object = None, error: BaseException | None = None) -> None:
        self.result, self.error, self.finished = result, error, True


FREE_BYTES_TO_RECOVER = 8 * 1024 * 1024
"""After a disk-full write, the store reports full until its disk has this much free."""


class Store:
    """The service's SQLite database. ``open()`` creates the file and the schema."""

    def __init__(self, path: Path | str, *, busy_timeout_ms: int = 5000):
        self.path = Path(path)
        self.busy_timeout_ms = busy_timeout_ms
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self.full = False  # the last write failed with SQLITE_FULL (see _write)
        self._group: list[_GroupedWrite] = []  # job writes waiting for a group commit
        self._group_mutex = threading.Lock()

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
        try:
            conn = sqlite3.connect(
                str(self.path), check_same_thread=False, isolation_level=None, timeout=30
            )
        except sqlite3.Error as err:
            raise StoreUnusable(f"cannot open {self.path}: {err}") from err
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            # Reading the schema first: a corrupt or foreign file fails here, before any
            # statement below could write to it.
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(self.path) != ":memory:" and mode.lower() != "wal":
                raise RuntimeError(f"SQLite refused WAL mode for {self.path} (got {mode!r})")
            conn.execute("PRAGMA synchronous = FULL")
            # Freed pages are zeroed only where that costs no extra write: this build's
            # default (secure_delete on) rewrote every freed page, which made the commit
            # that drops a merged multi-host step's part arrays (about 2 MB for 64 hosts x
            # 1,000 steps) take 13.7 ms instead of 1-2 ms.
            conn.execute("PRAGMA secure_delete = FAST")
            conn.execute("PRAGMA foreign_keys = ON")
            conn.executescript(SCHEMA)
            self._migrate(conn)
        except sqlite3.DatabaseError as err:
            conn.close()
            raise StoreUnusable(f"{self.path} is not a usable SQLite database: {err}") from err
        except Exception:
            conn.close()
            raise
        self._conn = conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        """Brings the file to :data:`SCHEMA_VERSION`, one version per transaction."""
        version = max(1, conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise RuntimeError(
                f"{self.path} has schema version {version}, newer than this service's "
                f"{SCHEMA_VERSION}; run the newer service or point DATARAX_DB elsewhere"
            )
        for target in range(version + 1, SCHEMA_VERSION + 1):
            conn.execute("BEGIN IMMEDIATE")
            try:
                MIGRATIONS[target](conn)
                conn.execute(f"PRAGMA user_version = {target}")
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    @property
    def schema_version(self) -> int:
        return self._run(lambda c: c.execute("PRAGMA user_version").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def disk_full(self) -> bool:
        """True after a write failed for lack of disk space, until the disk has
        ``FREE_BYTES_TO_RECOVER`` free again (readiness says so meanwhile)."""
        if self.full:
            try:
                stats = os.statvfs(self.path.parent)
                self.full = stats.f_bavail * stats.f_frsize < FREE_BYTES_TO_RECOVER
            except OSError:
                pass
        return self.full

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
        with self._lock:
            return self._write_locked(fn)

    def _write_locked(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """:meth:`_write` with the lock already held."""
        conn = self._conn
        if conn is None:
            raise StoreClosed("the store is not open")
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(conn)
            conn.execute("COMMIT")
        except BaseException as err:
            # Also after a failed COMMIT (disk full, I/O error): never leave the shared
            # connection inside a transaction.
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(err, sqlite3.Error) and _is_disk_full(err):
                self.full = True
                raise StorageFull(
                    f"the database disk is full ({self.path}); nothing was written. "
                    "Free space on that disk and retry"
                ) from None
            raise
        self.full = False
        return result

    async def _in_thread(self, fn: Callable[[], T]) -> T:
        return await anyio.to_thread.run_sync(fn)

    async def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Runs ``fn(conn)`` in one ``BEGIN IMMEDIATE`` transaction in a worker thread;
        returns after the durable commit (all or nothing: an exception rolls back)."""
        return await self._in_thread(lambda: self._write(fn))

    async def write_grouped(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """As :meth:`write`, but writes that wait at the same time share one transaction
        and one fsync (group commit), each in its own savepoint: a write that raises is
        rolled back alone and gets its error; the others commit together, and every
        caller returns only after that durable commit. For job pushes: 64 hosts pushing
        at once cost a few commits, not 64."""
        return await self._in_thread(lambda: self._write_grouped(fn))

    def write_grouped_here(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """:meth:`write_grouped` for a caller already in a worker thread (never on the
        event loop: it blocks until the durable commit)."""
        return self._write_grouped(fn)

    def _write_grouped(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        mine = _GroupedWrite(fn)
        with self._group_mutex:
            self._group.append(mine)
        with self._lock:
            if not mine.finished:
                # Leader: commit every write waiting now (its own among them).
                with self._group_mutex:
                    group, self._group = self._group[:MAX_GROUP], self._group[MAX_GROUP:]
                if self._conn is None:
                    for write in group:
                        write.finish(error=StoreClosed("the store is not open"))
                else:
                    self._commit_group(self._conn, group)
        if mine.error is not None:
            raise mine.error
        return mine.result  # type: ignore[return-value]

    def _commit_group(self, conn: sqlite3.Connection, group: list[_GroupedWrite]) -> None:
        """One transaction for ``group`` (the lock held). A write that raises a
        ``ServiceError`` is rolled back to its savepoint; any other failure (an SQLite
        error may have rolled back the whole transaction) rolls back everything and runs
        each write alone, as :meth:`write` would."""
        if len(group) == 1:
            self._alone(group[0])
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
            for write in group:
                conn.execute("SAVEPOINT grouped_write")
                try:
                    write.result = write.fn(conn)
                except ServiceError as err:
                    conn.execute("ROLLBACK TO grouped_write")
                    write.error = err
                conn.execute("RELEASE grouped_write")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            for write in group:
                write.result = write.error = None
                self._alone(write)
            return
        self.full = False
        for write in group:
            write.finished = True

    def _alone(self, write: _GroupedWrite) -> None:
        try:
            write.finish(result=self._write_locked(write.fn))
        except BaseException as err:
            write.finish(error=err)

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Runs ``fn(conn)`` in a worker thread (reads only)."""
        return await self._in_thread(lambda: self._run(fn))

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

    async def get_plan_summary(self, plan_id: str) -> str | None:
        """The stored plan's summary JSON text (every member but the per-device ones), or
        None."""

        def read(c: sqlite3.Connection) -> str | None:
            row = c.execute("SELECT summary FROM plans WHERE id = ?", (plan_id,)).fetchone()
            return None if row is None else row[0]

        return await self._in_thread(lambda: self._run(read))

    async def list_plans(
        self, limit: int, offset: int, *, summary: bool = False, max_bytes: int | None = None
    ) -> tuple[list[str] | None, int]:
        """Plan JSON texts (or summaries), newest first (insertion order), and the total;
        None instead of the texts as soon as they would pass ``max_bytes``."""
        column = "summary" if summary else "body"

        def read(c: sqlite3.Connection) -> tuple[list[str] | None, int]:
            total = c.execute("SELECT COUNT(*) FROM plans").fetchone()[0]
            cursor = c.execute(
                f"SELECT {column} FROM plans ORDER BY rowid DESC LIMIT ? OFFSET ?", (limit, offset)
            )
            texts, size = [], 0
            for (text,) in cursor:  # row by row: stop before holding too much
                size += len(text)
                if max_bytes is not None and size > max_bytes:
                    cursor.close()
                    return None, int(total)
                texts.append(text)
            return texts, int(total)

        return await self._in_thread(lambda: self._run(read))

    async def delete_plan(self, plan_id: str) -> bool:
        """Deletes a plan; False when there was none."""

        def delete(c: sqlite3.Connection) -> bool:
            return c.execute("DELETE FROM plans WHERE id = ?", (plan_id,)).rowcount > 0

        return await self._in_thread(lambda: self._write(delete))

    # ----------------------------------------------------------------------- job points
    # The job tables' SQL is app/store_jobs.py; app/services/jobs.py runs it through
    # write() and read().

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

    async def list_sessions(
        self, limit: int, offset: int, mesh_id: str | None = None
    ) -> tuple[list[str], int]:
        """Session JSON texts, newest first, and the total (of ``mesh_id``'s, when given)."""
        where, args = ("WHERE mesh_id = ?", (mesh_id,)) if mesh_id is not None else ("", ())

        def read(c: sqlite3.Connection) -> tuple[list[str], int]:
            total = c.execute(f"SELECT COUNT(*) FROM sessions {where}", args).fetchone()[0]
            rows = c.execute(
                f"SELECT body FROM sessions {where} ORDER BY rowid DESC LIMIT ? OFFSET ?",
                (*args, limit, offset),
            ).fetchall()
            return [row[0] for row in rows], int(total)

        return await self._in_thread(lambda: self._run(read))
