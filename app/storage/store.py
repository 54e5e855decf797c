"""The store interface: what the service and the table modules use of a database.

:class:`Store` names it, and holds the machinery every engine shares: the fault
bookkeeping that readiness reports (:attr:`Store.fault`, :meth:`Store.health`), the
group commit of job pushes (:meth:`Store.write_grouped`) and the worker-thread forms of
each call. Each engine is one subclass beside the others, saying its own SQL and
translating its driver's errors at its edge into the interface's
(:mod:`app.storage.errors`, the storage problems of :mod:`app.core.errors`):

- :class:`app.storage.db.SQLiteStore`: one SQLite file, one connection per process;
- :class:`app.storage.postgres.PostgresStore`: one PostgreSQL database shared by several
  service processes.

:func:`app.storage.engines.store_at` picks one from the setting; nothing above the
storage package knows which engine holds the data. The methods that take a function over
a :class:`Connection` (``write``, ``read``, ``execute``, ``write_grouped``, ``delete`` and
their ``*_here`` forms) are package-private: only the table modules of this package call
them (``tests/test_import_graph.py`` checks that nothing outside does).
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple, Protocol, TypeVar, cast

import anyio.to_thread

from app.core.errors import ServiceError
from app.storage.errors import StoreClosed

log = logging.getLogger("datarax.store")

T = TypeVar("T")

RETRY_AFTER_S = 5  # ``Retry-After`` of a 503 ``storage_unavailable``

PROBE_INTERVAL_S = 2.0
""":meth:`Store.health` writes a probe row when no write succeeded or failed for this long:
readiness notices a fault (and its end) without client writes, one tiny write at most."""

MAX_GROUP = 64
"""Most writes one group commit takes (:meth:`Store.write_grouped`)."""


class ArrayInsert(NamedTuple):
    """PostgreSQL's form of an ``INSERT ... VALUES`` sent for many rows: one statement
    over arrays, ``INSERT ... SELECT ... FROM unnest(%b::T[], ...)``, that writes every row
    at once (psycopg sends each row of an ``executemany`` as its own bind and execute).

    Attributes:
      sql: the statement, one ``%b`` (a binary array, :mod:`app.storage.pg_arrays`) per
        parameter of the row, in the row's order.
      types: each array's element type, in the same order.
      keys: positions in the row of the ``ON CONFLICT`` key's columns (none: no upsert).
        One statement may not update a row twice, so rows whose keys repeat go one by one.
    """

    sql: str
    types: tuple[str, ...]
    keys: tuple[int, ...] = ()


class Statement(NamedTuple):
    """One statement in each engine's own words, as the table modules state it; the
    engine that runs it reads its own text.

    Attributes:
      sqlite: SQLite's text (``?`` placeholders).
      postgres: PostgreSQL's text (``%s`` placeholders; a literal ``%`` doubled).
      many: PostgreSQL's form of the statement for many rows (an insert sent with
        ``executemany``), or None to send them one by one.
    """

    sqlite: str
    postgres: str
    many: ArrayInsert | None = None


class Cursor(Protocol):
    """What the table modules read of a statement's result (``sqlite3``'s and psycopg's
    cursors alike)."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def close(self) -> None: ...

    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """What the table modules do with a connection the store hands them: run statements
    (each in its engine's own words), inside the transaction the store opened."""

    def execute(self, statement: Statement, parameters: Sequence[Any] = ..., /) -> Cursor: ...

    def executemany(
        self, statement: Statement, parameters: Iterable[Sequence[Any]], /
    ) -> Cursor: ...

    def executescript(self, script: Statement, /) -> object: ...


@dataclasses.dataclass(frozen=True)
class StorageFault:
    """Why the store cannot take writes: ``kind`` is ``full`` or ``unavailable`` (the
    problem code's tail), ``reason`` the driver's error, ``since`` when it began and
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
    """One writer connection of this process on one database, and what every store on it
    shares: its lock and its fault state."""

    def __init__(self, key: str, conn: Any) -> None:
        self.key = key
        self.conn = conn
        self.lock = threading.Lock()
        self.users = 1
        self.fault: StorageFault | None = None
        self.outcome_at = time.monotonic()  # when a write last succeeded or failed


class _GroupedWrite:
    """One caller's write waiting for a group commit, and its outcome."""

    __slots__ = ("error", "finished", "fn", "key", "result")

    def __init__(self, fn: Callable[[Connection], object], key: str | None) -> None:
        self.fn, self.key, self.finished = fn, key, False
        self.result: object = None
        self.error: BaseException | None = None

    def finish(self, *, result: object = None, error: BaseException | None = None) -> None:
        self.result, self.error, self.finished = result, error, True


class Store(abc.ABC):
    """The service's database, whichever engine holds it (see the module docstring).

    Attributes:
      where: the database's location in messages (a path, or a URL without password).
      dynamic_types: True when a column holds text or bytes alike (SQLite's do).
      owner_grace_s: how long a starting process waits for the owner of unfinished work
        to reconnect before it fails that work (:mod:`app.storage.owners`).
    """

    dynamic_types: bool = False
    owner_grace_s: float = 0.0

    def __init__(self, where: str) -> None:
        self.where = where
        self._db: _Database | None = None
        self._conn: Any = None  # the writer connection while open
        self._lock = threading.Lock()  # the shared connection's lock once open
        self._group: list[_GroupedWrite] = []  # job writes waiting for a group commit
        self._group_mutex = threading.Lock()

    # ------------------------------------------------------------------------ lifecycle

    @property
    def is_open(self) -> bool:
        return self._conn is not None

    @abc.abstractmethod
    def open(self) -> None:
        """Opens (creating if needed) the database and its schema. Idempotent.

        Raises:
          StoreUnusable: the database cannot be used (and was left as it was).
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Closes the store's connections."""

    @property
    @abc.abstractmethod
    def schema_version(self) -> int:
        """The database's schema version."""

    @abc.abstractmethod
    def live_owners(self, conn: Connection) -> set[int]:
        """The service processes alive on this database (:mod:`app.storage.owners`)."""

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
        the probe interval (:data:`PROBE_INTERVAL_S`), it first commits a one-row probe
        write, so a fault that began (or ended) while nobody wrote is seen.
        """
        db = self._db
        if db is None:
            now = _now()
            return StorageFault("unavailable", "the database is not open", now, now)
        if time.monotonic() - db.outcome_at >= self._probe_interval_s():
            try:
                self._write(lambda c: c.execute(_PROBE, (_now(), _now())))
            except (ServiceError, StoreClosed):
                pass  # recorded as the fault (or the store closed meanwhile)
        return db.fault

    def _probe_interval_s(self) -> float:
        return PROBE_INTERVAL_S

    def ping(self) -> bool:
        """True when the store is open and :meth:`health` finds no fault."""
        return self._db is not None and self.health() is None

    @abc.abstractmethod
    def _problem(self, err: BaseException) -> tuple[ServiceError | None, str]:
        """The problem a failure answers with (None: not a storage one), and its reason."""

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
        """A write committed: clears the fault."""
        db = self._db
        if db is None:
            return
        db.outcome_at = time.monotonic()
        if db.fault is not None:
            log.warning(
                "database %s takes writes again (fault since %s)", self.where, db.fault.since
            )
            db.fault = None

    # ------------------------------------------------------------------------ plumbing

    @abc.abstractmethod
    def _run(self, fn: Callable[[Connection], T]) -> T:
        """Runs ``fn`` in autocommit mode (each statement its own transaction); a storage
        failure becomes its problem (and the fault)."""

    @abc.abstractmethod
    def _write_locked(self, fn: Callable[[Connection], T]) -> T:
        """Runs ``fn`` in one write transaction, the lock held; returns after the durable
        commit (all or nothing: an exception rolls back)."""

    @abc.abstractmethod
    def _leave_transaction(self, conn: Any) -> None:
        """Leaves ``conn`` outside any transaction, whatever happened to it."""

    @abc.abstractmethod
    async def read(self, fn: Callable[[Connection], T]) -> T:
        """Runs ``fn(conn)`` in a worker thread (reads only)."""

    def _write(self, fn: Callable[[Connection], T]) -> T:
        """Runs ``fn`` in one transaction; returns after the durable commit."""
        with self._lock:
            return self._write_locked(fn)

    def write_here(self, fn: Callable[[Connection], T]) -> T:
        """:meth:`write` for a caller already in a worker thread (or at startup): blocks
        until the durable commit."""
        return self._write(fn)

    async def _in_thread(self, fn: Callable[[], T]) -> T:
        return await anyio.to_thread.run_sync(fn)

    async def write(self, fn: Callable[[Connection], T]) -> T:
        """Runs ``fn(conn)`` in one write transaction in a worker thread; returns after the
        durable commit (all or nothing: an exception rolls back)."""
        return await self._in_thread(lambda: self._write(fn))

    async def write_grouped(self, fn: Callable[[Connection], T], *, key: str | None = None) -> T:
        """As :meth:`write`, but writes that wait at the same time share one transaction
        and one durable commit (group commit), each in its own savepoint: a write that
        raises is rolled back alone and gets its error; the others commit together, and
        every caller returns only after that commit. For job pushes: 64 hosts pushing at
        once cost a few commits, not 64. ``key`` names what the write changes (a job):
        writes of one key from several processes on a shared database queue for it."""
        return await self._in_thread(lambda: self._write_grouped(fn, key))

    def write_grouped_here(self, fn: Callable[[Connection], T], *, key: str | None = None) -> T:
        """:meth:`write_grouped` for a caller already in a worker thread (never on the
        event loop: it blocks until the durable commit)."""
        return self._write_grouped(fn, key)

    def _write_grouped(self, fn: Callable[[Connection], T], key: str | None = None) -> T:
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
                    self._commit_group(group)
        if mine.error is not None:
            raise mine.error
        return cast(T, mine.result)  # the result of ``fn``, set by the group's commit

    @abc.abstractmethod
    def _writer_view(self) -> Connection:
        """The writer connection as the table modules see it (the lock held)."""

    def _commit_group(self, group: list[_GroupedWrite]) -> None:
        """:meth:`_commit_on` the writer (the lock held)."""
        self._commit_on(self._writer_view(), group)

    def _commit_on(self, conn: Connection, group: list[_GroupedWrite]) -> None:
        """One transaction for ``group`` (the lock held). A write that raises a
        ``ServiceError`` is rolled back to its savepoint; any other failure (the driver
        may have rolled back the whole transaction) rolls back everything and runs each
        write alone, as :meth:`write` would."""
        if len(group) == 1:
            self._alone(group[0])
            return
        try:
            conn.execute(_BEGIN_WRITE)
            for write in group:
                conn.execute(_SAVEPOINT)
                try:
                    write.result = write.fn(conn)
                except ServiceError as err:
                    conn.execute(_ROLLBACK_TO_SAVEPOINT)
                    write.error = err
                conn.execute(_RELEASE_SAVEPOINT)
            conn.execute(_COMMIT)
        except BaseException:
            self._leave_transaction(conn)
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

    async def execute(self, fn: Callable[[Connection], T]) -> T:
        """Runs ``fn(conn)`` in a worker thread in autocommit mode: each statement is its
        own transaction (for callers whose statements stand alone, such as the compile
        store's). Storage failures answer as for :meth:`write`."""
        return await self._in_thread(lambda: self._run(fn))

    def execute_here(self, fn: Callable[[Connection], T]) -> T:
        """:meth:`execute` for a caller already in a worker thread (or at startup)."""
        return self._run(fn)

    async def delete(
        self,
        fn: Callable[[Connection], T],
        *,
        piece: Callable[[Connection, int], int] | None = None,
    ) -> T:
        """:meth:`write` for what a ``DELETE`` removes, which works on a full disk where
        the engine can (SQLite's space reserve, in pieces when ``piece(conn, rows)`` is
        given: :mod:`app.storage.reserve`).

        Raises:
          StorageFull: the disk is full and the engine has no room kept for deletes.
        """
        return await self._in_thread(lambda: self.delete_here(fn, piece=piece))

    def delete_here(
        self,
        fn: Callable[[Connection], T],
        *,
        piece: Callable[[Connection, int], int] | None = None,  # noqa: ARG002 (SQLite's reads it)
    ) -> T:
        """:meth:`delete` for a caller already in a worker thread."""
        return self._write(fn)


_BEGIN_WRITE = Statement("BEGIN IMMEDIATE", "BEGIN ISOLATION LEVEL SERIALIZABLE")
"""A write transaction. SQLite's single writer makes every write transaction serializable;
PostgreSQL gives the same guarantee across processes only at that level (the store retries
a transaction that loses: :mod:`app.storage.postgres`)."""
_SAVEPOINT = Statement("SAVEPOINT grouped_write", "SAVEPOINT grouped_write")
_ROLLBACK_TO_SAVEPOINT = Statement("ROLLBACK TO grouped_write", "ROLLBACK TO grouped_write")
_RELEASE_SAVEPOINT = Statement("RELEASE grouped_write", "RELEASE grouped_write")
_COMMIT = Statement("COMMIT", "COMMIT")
_PROBE = Statement(
    "INSERT INTO store_probe (id, at) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET at = ?",
    "INSERT INTO store_probe (id, at) VALUES (1, %s) ON CONFLICT (id) DO UPDATE SET at = %s",
)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
