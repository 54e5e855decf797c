"""The storage engine: one SQLite file, its connection, its faults and its transactions.

The tables' statements live beside this module, one module per table family (see
:mod:`app.storage`); every schema and migration in :mod:`app.storage.migrations`. The
methods here that take a function over the raw ``sqlite3.Connection``
(:meth:`Store.write`, :meth:`Store.read`, ...) are for those modules only: callers
outside :mod:`app.storage` use the typed per-table functions.

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
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar, cast

import anyio.to_thread

from app.core.errors import ServiceError, StorageFull, StorageUnavailable
from app.storage.migrations import MIGRATIONS, SCHEMA, SCHEMA_VERSION
from app.storage.owners import OWNER
from app.storage.reserve import DiskRoom, disk_free

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


RETRY_AFTER_S = 5  # ``Retry-After`` of a 503 ``storage_unavailable``

_PROBE = "INSERT INTO store_probe (id, at) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET at = ?"
PROBE_INTERVAL_S = 2.0
""":meth:`Store.health` writes a probe row when no write succeeded or failed for this long:
readiness notices a fault (and its end) without client writes, one tiny write at most."""


@dataclasses.dataclass(frozen=True)
class StorageFault:
    """Why the store cannot take writes: ``kind`` is ``full`` or ``unavailable`` (the
    problem code's tail), ``reason`` SQLite's error, ``since`` when it began and
    ``checked_at`` when a write (a client's or the probe) last found it (UTC, ISO 8601
    with microseconds: later times sort later)."""

    kind: str
    reason: str
    since: str
    checked_at: str = ""

    @property
    def code(self) -> str:
        return f"storage_{self.kind}"


class _Database:
    """One connection of this process on one database file, and what every
    :class:`Store` on that file shares: its lock and its fault state."""

    def __init__(self, key: str, conn: sqlite3.Connection) -> None:
        self.key = key
        self.conn = conn
        self.lock = threading.Lock()
        self.users = 1
        self.fault: StorageFault | None = None
        self.outcome_at = time.monotonic()  # when a write last succeeded or failed
        self.room: DiskRoom | None = None  # the space reserve and fence (files only)


_DATABASES: dict[str, _Database] = {}
"""Open connections by the database file's real path (``:memory:`` ones are not shared)."""
_DATABASES_LOCK = threading.Lock()


class StoreClosed(RuntimeError):
    """The store was used before ``open()`` or after ``close()``."""


class StoreUnusable(RuntimeError):
    """The database file exists but SQLite cannot use it (corrupt, truncated, not a
    database, unreadable). The file is left exactly as it was."""


MAX_GROUP = 64
"""Most writes one group commit takes (:meth:`Store.write_grouped`)."""


class _GroupedWrite:
    """One caller's write waiting for a group commit, and its outcome."""

    __slots__ = ("error", "finished", "fn", "key", "result")

    def __init__(self, fn: Callable[[sqlite3.Connection], object], key: str | None) -> None:
        self.fn, self.key, self.finished = fn, key, False
        self.result: object = None
        self.error: BaseException | None = None

    def finish(self, *, result: object = None, error: BaseException | None = None) -> None:
        self.result, self.error, self.finished = result, error, True


FREE_BYTES_TO_RECOVER = 8 * 1024 * 1024
"""After a disk-full write, the store reports full until it has this much room: free pages
in its file, plus the free disk unless the file is fenced (:mod:`app.storage.reserve`)."""


class Store:
    """The service's SQLite database. ``open()`` creates the file and the schema."""

    dynamic_types = True  # a column holds text or bytes alike (PostgreSQL's do not)

    def __init__(self, path: Path | str, *, busy_timeout_ms: int = 5000):
        self.path = Path(path)
        self.where = str(path)  # the store's location in messages
        self.busy_timeout_ms = busy_timeout_ms
        self._db: _Database | None = None
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()  # the shared connection's lock once open
        self._group: list[_GroupedWrite] = []  # job writes waiting for a group commit
        self._group_mutex = threading.Lock()

    # ------------------------------------------------------------------------ lifecycle

    @property
    def is_open(self) -> bool:
        return self._conn is not None

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
                db = _Database(key, self._connect())
                if not memory:
                    self._start_room(db)
                    _DATABASES[key] = db
        self._lock = db.lock
        with db.lock:
            self._db, self._conn = db, db.conn

    def _start_room(self, db: _Database) -> None:
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

    def live_owners(self, conn: sqlite3.Connection) -> set[int]:  # noqa: ARG002 (PostgreSQL's reads it)
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

    @property
    def fault(self) -> StorageFault | None:
        """Why writes fail now (set by a failed write, cleared by a successful one), or
        None."""
        return None if self._db is None else self._db.fault

    @property
    def full(self) -> bool:
        """True while the last storage fault is a full disk."""
        fault = self.fault
        return fault is not None and fault.kind == "full"

    def health(self) -> StorageFault | None:
        """The storage fault readiness reports, or None when writes work.

        Blocking (call it from a worker thread): when no write succeeded or failed within
        :data:`PROBE_INTERVAL_S`, it first commits a one-row probe write, so a fault
        that began (or ended) while nobody wrote is seen. A full disk stays a fault
        until a write succeeds *and* the disk has ``FREE_BYTES_TO_RECOVER`` free.
        """
        db = self._db
        if db is None:
            now = _now()
            return StorageFault("unavailable", "the database is not open", now, now)
        if time.monotonic() - db.outcome_at >= PROBE_INTERVAL_S:
            try:
                self._write(lambda c: c.execute(_PROBE, (_now(), _now())))
            except (ServiceError, StoreClosed):
                pass  # recorded as the fault (or the store closed meanwhile)
        return db.fault

    def ping(self) -> bool:
        """True when the store is open and :meth:`health` finds no fault."""
        return self._db is not None and self.health() is None

    def _problem(self, err: BaseException) -> tuple[ServiceError | None, str]:
        """The problem a failure answers with (None: not a storage one), and its reason."""
        name = getattr(err, "sqlite_errorname", None) or type(err).__name__
        return storage_error(err, self.path), f"{name}: {err}"

    def _failed(self, err: BaseException) -> ServiceError | None:
        """Records a storage failure as the fault; returns its problem (None: not one)."""
        problem, reason = self._problem(err)
        db = self._db
        if problem is None or db is None:
            return problem
        kind = "full" if problem.code == "storage_full" else "unavailable"
        now = _now()
        if db.fault is None or db.fault.kind != kind:
            log.warning("database %s cannot take writes: %s", self.where, reason)
            db.fault = StorageFault(kind, reason, now, now)
        else:
            db.fault = dataclasses.replace(db.fault, reason=reason, checked_at=now)
        db.outcome_at = time.monotonic()
        return problem

    def _succeeded(self) -> None:
        """A write committed: clears the fault (a full disk needs free space too)."""
        db = self._db
        if db is None:
            return
        db.outcome_at = time.monotonic()
        if db.room is not None:
            try:
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

    # ------------------------------------------------------------------------ plumbing

    def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Runs ``fn`` under the lock in autocommit mode (each statement its own
        transaction); a storage failure becomes its problem (and the fault)."""
        with self._lock:
            conn = self._conn
            if conn is None:
                raise StoreClosed("the store is not open")
            before = conn.total_changes
            try:
                result = fn(conn)
            except sqlite3.Error as err:
                _rollback(conn)
                problem = self._failed(err)
                if problem is not None:
                    raise problem from err
                raise
            if conn.total_changes != before:
                self._succeeded()
            return result

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Runs ``fn`` in one transaction; returns after the durable commit."""
        with self._lock:
            return self._write_locked(fn)

    def _write_locked(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """:meth:`_write` with the lock already held."""
        conn = self._conn
        if conn is None:
            raise StoreClosed("the store is not open")
        before = conn.total_changes
        try:
            conn.execute("BEGIN IMMEDIATE")
            result = fn(conn)
            conn.execute("COMMIT")
        except BaseException as err:
            # Also after a failed COMMIT (disk full, I/O error): never leave the shared
            # connection inside a transaction.
            _rollback(conn)
            problem = self._failed(err)
            if problem is not None:
                raise problem from err
            raise
        if conn.total_changes != before:  # a transaction that wrote nothing proves nothing
            self._succeeded()
        return result

    def write_here(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """:meth:`write` for a caller already in a worker thread (or at startup): blocks
        until the durable commit."""
        return self._write(fn)

    async def _in_thread(self, fn: Callable[[], T]) -> T:
        return await anyio.to_thread.run_sync(fn)

    async def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Runs ``fn(conn)`` in one ``BEGIN IMMEDIATE`` transaction in a worker thread;
        returns after the durable commit (all or nothing: an exception rolls back)."""
        return await self._in_thread(lambda: self._write(fn))

    async def write_grouped(
        self, fn: Callable[[sqlite3.Connection], T], *, key: str | None = None
    ) -> T:
        """As :meth:`write`, but writes that wait at the same time share one transaction
        and one fsync (group commit), each in its own savepoint: a write that raises is
        rolled back alone and gets its error; the others commit together, and every
        caller returns only after that durable commit. For job pushes: 64 hosts pushing
        at once cost a few commits, not 64. ``key`` names what the write changes (a job):
        writes of one key from several processes on a shared database queue for it."""
        return await self._in_thread(lambda: self._write_grouped(fn, key))

    def write_grouped_here(
        self, fn: Callable[[sqlite3.Connection], T], *, key: str | None = None
    ) -> T:
        """:meth:`write_grouped` for a caller already in a worker thread (never on the
        event loop: it blocks until the durable commit)."""
        return self._write_grouped(fn, key)

    def _write_grouped(self, fn: Callable[[sqlite3.Connection], T], key: str | None = None) -> T:
        mine = _GroupedWrite(fn, key)
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
        return cast(T, mine.result)  # the result of ``fn``, set by the group's commit

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
            _rollback(conn)
            for write in group:
                write.result = write.error = None
                self._alone(write)
            return
        self._succeeded()
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

    async def execute(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Runs ``fn(conn)`` in a worker thread in autocommit mode: each statement is its
        own transaction (for callers whose statements stand alone, such as the compile
        store's). Storage failures answer as for :meth:`write`."""
        return await self._in_thread(lambda: self._run(fn))

    def execute_here(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """:meth:`execute` for a caller already in a worker thread (or at startup)."""
        return self._run(fn)

    async def delete(
        self,
        fn: Callable[[sqlite3.Connection], T],
        *,
        piece: Callable[[sqlite3.Connection, int], int] | None = None,
    ) -> T:
        """:meth:`write` for what a ``DELETE`` removes, which works on a full disk too: it
        then uses the space reserve, and a delete too big for that room runs in pieces
        when ``piece(conn, rows)`` is given (see :meth:`DiskRoom.delete`).

        Raises:
          StorageFull: not even the reserve's room was enough, or there is no reserve.
        """
        return await self._in_thread(lambda: self.delete_here(fn, piece=piece))

    def delete_here(
        self,
        fn: Callable[[sqlite3.Connection], T],
        *,
        piece: Callable[[sqlite3.Connection, int], int] | None = None,
    ) -> T:
        """:meth:`delete` for a caller already in a worker thread."""
        with self._lock:
            try:
                return self._write_locked(fn)
            except StorageFull:
                db = self._db
                if db is None or db.room is None:
                    raise
                return db.room.delete(db.conn, self._write_locked, fn, piece, self.path)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _rollback(conn: sqlite3.Connection) -> None:
    """Leaves ``conn`` outside any transaction; a failing ROLLBACK (the disk gone) is
    ignored: SQLite then rolled the transaction back itself or will on the next one."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            log.warning("ROLLBACK failed on the database", exc_info=True)
