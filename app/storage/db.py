"""The SQLite engine of the store: one SQLite file, its connection, its faults and its
transactions.

:class:`SQLiteStore` is one implementation of the store interface
(:class:`app.storage.store.Store`, whose group commit and fault bookkeeping it shares), beside
:class:`app.storage.postgres.PostgresStore`; neither knows the other. It translates
``sqlite3``'s errors at its edge: a constraint violation is
:class:`~app.storage.errors.Conflict`, a storage failure its problem
(:func:`storage_error`). The tables' statements live beside this module, one module per
table family (see :mod:`app.storage`); every schema and migration in
:mod:`app.storage.migrations`.

Durability: the database runs in WAL mode with ``synchronous=FULL``, so every commit
fsyncs the WAL before ``commit()`` returns. The service answers 2xx only after the
commit, hence an acknowledged write survives a ``kill -9`` of the service *and* a power
loss or OS crash. (``NORMAL`` with WAL would survive a process kill too, but may lose the
last transactions on power loss, which contradicts "2xx means durable"; one fsync per
write is cheap at this service's write rate.)

Concurrency: one connection per database file and process, guarded by a lock, used from
worker threads. Every :class:`Store` opened on the same file in this process (the service's
own and :mod:`app.storage.compile_checks`'s) shares that connection and its lock
(:class:`_Database`). Every public coroutine runs its blocking sqlite call through
``anyio.to_thread.run_sync`` so the event loop never blocks on disk.

No shared memory, hence no SIGBUS: in WAL mode SQLite normally ``mmap``s the wal-index
(the ``-shm`` file) ``MAP_SHARED``; when a page of that mapping cannot be backed (the file
made immutable with ``chattr +i``, a full tmpfs), the first store to it kills the process
with SIGBUS, which no Python code can catch (reproduced: ``chattr +i db.sqlite-shm`` during
pushes, exit by signal 7). The connection therefore sets ``PRAGMA locking_mode = EXCLUSIVE``
before its first access: SQLite then keeps the wal-index in heap memory and never creates
or maps a ``-shm`` file (SQLite docs, "WAL without shared memory",
https://www.sqlite.org/wal.html#noshm), and ``mmap_size = 0`` keeps the database file
itself unmapped. The price: this process holds the file's lock from the first read until
``close()``, so no other process can read or write the file while the service runs (a
second service on the same file fails at start: "in use by another process").

Storage faults never crash and never lie (:func:`storage_error`): a write that fails for
lack of space is 507 ``storage_full``; one that fails because the file, its directory or
its WAL cannot be written (read-only, immutable, I/O error) is 503 ``storage_unavailable``;
either way nothing of it was committed, and acknowledged writes stay (the WAL's committed
frames are never rolled back). The failure is remembered as :attr:`Store.fault` and
readiness reports it until a later write succeeds: a client's, or the probe that
:meth:`Store.health` writes at most every :data:`PROBE_INTERVAL_S` when nothing else
wrote. A write to the database file that fails only at checkpoint time (the file made
read-only, the WAL still writable) is not a fault: commits stay durable in the WAL, which
SQLite checkpoints once it can.

Deletes work on a full disk (:meth:`Store.delete`): the store keeps a space reserve beside
the file for them and fences the file while that reserve is used up (see
:mod:`app.storage.reserve`).

Bodies (plan JSON, reduced metrics) are stored as the exact JSON text the API answered,
so a read returns byte-identical JSON without re-serialising.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from app.core.errors import ServiceError, StorageFull, StorageUnavailable
from app.storage.errors import Conflict, StoreClosed, StoreUnusable
from app.storage.migrations import MIGRATIONS, SCHEMA, SCHEMA_VERSION
from app.storage.owners import OWNER
from app.storage.reserve import DiskRoom, disk_free
from app.storage.store import (
    PROBE_INTERVAL_S,
    RETRY_AFTER_S,
    Connection,
    Statement,
    _Database,
    _now,
)
from app.storage.store import Store as StoreInterface

log = logging.getLogger("datarax.store")

T = TypeVar("T")


def _is_disk_full(err: sqlite3.Error) -> bool:
    """SQLITE_FULL (13), or the I/O error some file systems give for ENOSPC instead."""
    code = getattr(err, "sqlite_errorcode", None)
    primary = None if code is None else code & 0xFF
    return primary == sqlite3.SQLITE_FULL or "disk is full" in str(err)


_UNAVAILABLE = frozenset(
    {
        sqlite3.SQLITE_IOERR,  # a read, write, fsync or truncate failed (EPERM, EIO, ...)
        sqlite3.SQLITE_READONLY,  # the file or its directory cannot be written
        sqlite3.SQLITE_CANTOPEN,  # the WAL or a journal cannot be created or opened
        sqlite3.SQLITE_PERM,
        sqlite3.SQLITE_CORRUPT,
        sqlite3.SQLITE_NOTADB,
        sqlite3.SQLITE_BUSY,  # another process holds the file (busy_timeout passed)
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_PROTOCOL,
        sqlite3.SQLITE_NOLFS,
    }
)
"""Primary SQLite result codes that mean "the storage cannot take writes now", not "this
statement is wrong": answered 503 ``storage_unavailable``. Constraint violations and
programming errors stay what they are (a caller maps them, or they are bugs)."""


def storage_error(err: BaseException, path: Path | str) -> ServiceError | None:
    """The problem a storage failure ``err`` on the file ``path`` answers with:
    ``StorageFull`` (507) for a full disk, ``StorageUnavailable`` (503, with
    ``Retry-After``) for a file, directory or WAL that cannot be written or read, None
    for anything else (constraint violations, bugs)."""
    if not isinstance(err, sqlite3.Error):
        return None
    name = getattr(err, "sqlite_errorname", None) or type(err).__name__
    if _is_disk_full(err):
        return StorageFull(
            f"the database disk is full ({path}); nothing was written. Free space on that "
            "disk, or delete jobs, plans or sessions you no longer need (deletes work on a "
            "full disk), and retry"
        )
    code = getattr(err, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in _UNAVAILABLE:
        return StorageUnavailable(
            f"the database cannot be written ({path}: {name}: {err}); nothing was written. "
            "Check that the file, its directory and its -wal file are writable and the disk "
            "is healthy; the service recovers by itself once a write succeeds",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    return None


class SQLiteConnection:
    """The connection as the table modules see it (:class:`~app.storage.store.Connection`):
    each :class:`~app.storage.store.Statement` runs its SQLite text. A plain string is a
    statement in SQLite's own words (this engine's internals, its tests)."""

    __slots__ = ("raw",)

    def __init__(self, raw: sqlite3.Connection) -> None:
        self.raw = raw

    def execute(self, statement: Statement | str, parameters: Sequence[Any] = ()) -> sqlite3.Cursor:
        sql = statement if isinstance(statement, str) else statement.sqlite
        return self.raw.execute(sql, parameters)

    def executemany(
        self, statement: Statement | str, parameters: Iterable[Sequence[Any]]
    ) -> sqlite3.Cursor:
        sql = statement if isinstance(statement, str) else statement.sqlite
        return self.raw.executemany(sql, parameters)

    def executescript(self, script: Statement | str) -> sqlite3.Cursor:
        return self.raw.executescript(script if isinstance(script, str) else script.sqlite)


class _SQLiteDatabase(_Database):
    """One connection of this process on one database file, shared by every
    :class:`SQLiteStore` on that file, with the file's space reserve and fence."""

    conn: sqlite3.Connection

    def __init__(self, key: str, conn: sqlite3.Connection) -> None:
        super().__init__(key, conn)
        self.view = SQLiteConnection(conn)  # what the table modules are handed
        self.room: DiskRoom | None = None  # the space reserve and fence (files only)


_DATABASES: dict[str, _SQLiteDatabase] = {}
"""Open connections by the database file's real path (``:memory:`` ones are not shared)."""
_DATABASES_LOCK = threading.Lock()


FREE_BYTES_TO_RECOVER = 8 * 1024 * 1024
"""After a disk-full write, the store reports full until it has this much room: free pages
in its file, plus the free disk unless the file is fenced (:mod:`app.storage.reserve`)."""


class SQLiteStore(StoreInterface):
    """The service's SQLite database. ``open()`` creates the file and the schema."""

    dynamic_types = True  # a column holds text or bytes alike (PostgreSQL's do not)

    def __init__(self, path: Path | str, *, busy_timeout_ms: int = 5000):
        super().__init__(str(path))
        self.path = Path(path)
        self.busy_timeout_ms = busy_timeout_ms
        self._db: _SQLiteDatabase | None = None
        self._conn: sqlite3.Connection | None = None

    # ------------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Opens (creating if needed) the database and its schema. Idempotent.

        A second ``Store`` on the same file in this process shares the first one's
        connection (see the module docstring); the file is closed with the last of them.

        Raises:
          StoreUnusable: the file is not a usable database, or another process holds it.
        """
        if self._db is not None:
            return
        memory = str(self.path) == ":memory:"
        if not memory:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        key = ":memory:" if memory else os.path.realpath(self.path)
        with _DATABASES_LOCK:
            db = None if memory else _DATABASES.get(key)
            if db is not None:
                db.users += 1
            else:
                db = _SQLiteDatabase(key, self._connect())
                if not memory:
                    self._start_room(db)
                    _DATABASES[key] = db
        self._lock = db.lock
        with db.lock:
            self._db, self._conn = db, db.conn

    def _start_room(self, db: _SQLiteDatabase) -> None:
        """Keeps the space reserve beside an accepted file (never before: a file that is
        not the service's gets no reserve)."""
        try:
            db.room = DiskRoom(self.path, db.conn)
            db.room.start(db.conn, FREE_BYTES_TO_RECOVER)
        except BaseException:
            db.conn.close()
            raise

    def _check_owned(self) -> bool:
        """Reads an existing file read-only before anything writes to it: a file of a
        newer schema version, or one holding tables but not the service's, is refused
        (:class:`StoreUnusable`) and left byte for byte as it was.

        Returns False when the main file alone cannot tell, a WAL with frames lying beside
        it (newer tables, or a checkpoint cut off by a crash or a full disk, which leaves
        the main file half written and unreadable alone): the main connection then judges
        the file through its WAL before anything writes (:meth:`_connect`)."""
        if str(self.path) == ":memory:" or not self.path.exists():
            return True
        wal = Path(f"{self.path}-wal")
        alone = not wal.exists() or not wal.stat().st_size  # the main file is the database
        if not self.path.stat().st_size:
            return alone
        try:
            # immutable: no locks, no WAL index, no -shm mapped or made (a stale -shm must
            # never be mapped); it reads the main file, enough for the version and tables
            ro = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
        except sqlite3.Error as err:
            raise StoreUnusable(f"cannot open {self.path}: {err}") from err
        try:
            version = ro.execute("PRAGMA user_version").fetchone()[0]
            tables = {row[0] for row in ro.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}  # fmt: skip
        except sqlite3.DatabaseError as err:  # immutable takes no locks: never busy here
            if not alone:
                return False
            raise StoreUnusable(
                f"{self.path} is not a usable SQLite database: {err}; it was left untouched"
            ) from err
        finally:
            ro.close()
        self._judge(version, tables)
        return alone

    def _judge(self, version: int, tables: set[str]) -> None:
        """Refuses a newer schema version, or tables that are not the service's."""
        if version > SCHEMA_VERSION:
            raise StoreUnusable(
                f"{self.path} has schema version {version}, newer than this service's "
                f"{SCHEMA_VERSION}; it was left untouched: run the newer service or point "
                "DATARAX_DB elsewhere"
            )
        if tables and "plans" not in tables:
            raise StoreUnusable(
                f"{self.path} holds tables that are not this service's "
                f"({', '.join(sorted(tables)[:5])}); it was left untouched: point DATARAX_DB "
                "at a new file or at the service's own"
            )

    def _connect(self) -> sqlite3.Connection:
        """A new connection with the service's pragmas, schema and migrations."""
        owned = self._check_owned()
        try:
            conn = sqlite3.connect(
                str(self.path), check_same_thread=False, isolation_level=None, timeout=30
            )
        except sqlite3.Error as err:
            raise StoreUnusable(f"cannot open {self.path}: {err}") from err
        try:
            # Until a file judged through its WAL is accepted, closing it must not
            # checkpoint the WAL into it.
            conn.setconfig(sqlite3.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, not owned)
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            # Before the first access: the wal-index in heap memory, no -shm file to map.
            conn.execute("PRAGMA locking_mode = EXCLUSIVE")
            conn.execute("PRAGMA mmap_size = 0")
            # Reading the schema first: a corrupt or foreign file fails here, before any
            # statement below could write to it.
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            if not owned:
                self._judge_through_wal(conn)
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
            # Take the write lock now (a no-op transaction), so a second process fails
            # here rather than on its first write.
            conn.execute("BEGIN EXCLUSIVE")
            conn.execute("COMMIT")
            locking = conn.execute("PRAGMA locking_mode").fetchone()[0]
            if locking.lower() != "exclusive":
                raise RuntimeError(f"SQLite refused exclusive locking for {self.path}")
        except sqlite3.DatabaseError as err:
            conn.close()
            code = getattr(err, "sqlite_errorcode", None)
            if code is not None and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                raise StoreUnusable(
                    f"{self.path} is in use by another process ({err}); one service per "
                    "database file: stop the other one or point DATARAX_DB elsewhere"
                ) from err
            if code is not None and code & 0xFF in (
                sqlite3.SQLITE_READONLY,
                sqlite3.SQLITE_CANTOPEN,
                sqlite3.SQLITE_IOERR,
                sqlite3.SQLITE_FULL,
            ):
                raise StoreUnusable(
                    f"{self.path} cannot be opened for writing ({err}): check that the file, "
                    "its directory and its -wal file are writable and the disk has space"
                ) from err
            raise StoreUnusable(f"{self.path} is not a usable SQLite database: {err}") from err
        except Exception:
            conn.close()
            raise
        return conn

    def _judge_through_wal(self, conn: sqlite3.Connection) -> None:
        """:meth:`_judge` on the main connection, reading through the WAL (a WAL file has
        no hot journal to roll back: nothing is written)."""
        tables = {row[0] for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}  # fmt: skip
        self._judge(conn.execute("PRAGMA user_version").fetchone()[0], tables)
        conn.setconfig(sqlite3.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, False)

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

    def live_owners(self, conn: Connection) -> set[int]:  # noqa: ARG002 (PostgreSQL's reads it)
        """The processes alive on this database (:mod:`app.storage.owners`): this one."""
        return {OWNER}

    def close(self) -> None:
        """Closes this store; the connection closes with the last store on its file."""
        db = self._db
        if db is None:
            return
        with db.lock:
            self._db = self._conn = None
        with _DATABASES_LOCK:
            db.users -= 1
            if db.users > 0:
                return
            if _DATABASES.get(db.key) is db:
                del _DATABASES[db.key]
        with db.lock:
            db.conn.close()

    # ------------------------------------------------------------------ faults, health

    def _probe_interval_s(self) -> float:
        return PROBE_INTERVAL_S  # this module's (the tests make it 0)

    def _problem(self, err: BaseException) -> tuple[ServiceError | None, str]:
        """The problem a failure answers with (None: not a storage one), and its reason."""
        name = getattr(err, "sqlite_errorname", None) or type(err).__name__
        return storage_error(err, self.path), f"{name}: {err}"

    def _translated(self, err: BaseException) -> BaseException:
        """What a failure raises at the store's edge: a storage one its problem (the fault),
        a constraint violation :class:`Conflict`, anything else itself (a bug)."""
        problem = self._failed(err)
        if problem is not None:
            return problem
        if isinstance(err, sqlite3.IntegrityError):
            return Conflict(str(err))
        return err

    def _succeeded(self) -> None:
        """A write committed: clears the fault (a full disk needs free space too)."""
        db = self._db
        if db is None:
            return
        db.outcome_at = time.monotonic()
        if db.room is not None:
            try:
                if db.room.fenced:  # rare: after a disk-full refusal
                    db.room.committed(db.conn, self.path, FREE_BYTES_TO_RECOVER)
            except sqlite3.Error:  # the commit stands; the fence is retried on the next one
                log.warning("the space reserve could not be kept", exc_info=True)
        fault = db.fault
        if fault is None:
            return
        room = disk_free(self.path) if db.room is None else db.room.room(db.conn, self.path)
        if fault.kind == "full" and room < FREE_BYTES_TO_RECOVER:
            db.fault = dataclasses.replace(fault, checked_at=_now())
            return
        log.warning("database %s takes writes again (fault since %s)", self.path, fault.since)
        db.fault = None

    def _leave_transaction(self, conn: SQLiteConnection) -> None:
        _rollback(conn.raw)

    def _writer_view(self) -> SQLiteConnection:
        db = self._db
        if db is None:
            raise StoreClosed("the store is not open")
        return db.view

    # ------------------------------------------------------------------------ plumbing

    def _run(self, fn: Callable[[SQLiteConnection], T]) -> T:
        """Runs ``fn`` under the lock in autocommit mode (each statement its own
        transaction); a storage failure becomes its problem (and the fault)."""
        with self._lock:
            conn = self._conn
            if conn is None:
                raise StoreClosed("the store is not open")
            before = conn.total_changes
            try:
                result = fn(self._writer_view())
            except sqlite3.Error as err:
                _rollback(conn)
                if (translated := self._translated(err)) is not err:
                    raise translated from err
                raise
            if conn.total_changes != before:
                self._succeeded()
            return result

    def _write_locked(self, fn: Callable[[SQLiteConnection], T]) -> T:
        """:meth:`_write` with the lock already held."""
        conn = self._conn
        if conn is None:
            raise StoreClosed("the store is not open")
        before = conn.total_changes
        try:
            conn.execute("BEGIN IMMEDIATE")
            result = fn(self._writer_view())
            conn.execute("COMMIT")
        except BaseException as err:
            # Also after a failed COMMIT (disk full, I/O error): never leave the shared
            # connection inside a transaction.
            _rollback(conn)
            if (translated := self._translated(err)) is not err:
                raise translated from err
            raise
        if conn.total_changes != before:  # a transaction that wrote nothing proves nothing
            self._succeeded()
        return result

    async def read(self, fn: Callable[[Connection], T]) -> T:
        """Runs ``fn(conn)`` in a worker thread (reads only)."""
        return await self._in_thread(lambda: self._run(fn))

    def delete_here(
        self,
        fn: Callable[[Connection], T],
        *,
        piece: Callable[[Connection, int], int] | None = None,
    ) -> T:
        """:meth:`delete` for a caller already in a worker thread: on a full disk, the
        delete uses the space reserve (:meth:`DiskRoom.delete`)."""
        with self._lock:
            try:
                return self._write_locked(fn)
            except StorageFull:
                db = self._db
                if db is None or db.room is None:
                    raise
                return db.room.delete(db.conn, self._write_locked, fn, piece, self.path)


def _rollback(conn: sqlite3.Connection) -> None:
    """Leaves ``conn`` outside any transaction; a failing ROLLBACK (the disk gone) is
    ignored: SQLite then rolled the transaction back itself or will on the next one."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            log.warning("ROLLBACK failed on the database", exc_info=True)


Store = SQLiteStore
"""The SQLite engine's former name, for the tests and benchmarks that build one by it; the
interface every engine implements is :class:`app.storage.store.Store`."""
