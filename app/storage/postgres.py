"""The PostgreSQL engine of the store: several service processes on one database.

:class:`PostgresStore` is one implementation of the store interface
(:class:`app.storage.store.Store`, whose group commit and fault bookkeeping it shares),
beside SQLite's :class:`~app.storage.db.SQLiteStore`; neither knows the other. The table
modules hand it the same functions over a connection; each statement they state carries
PostgreSQL's own text (:class:`~app.storage.store.Statement`), which this engine runs
as it is. It translates psycopg's errors at its edge: a constraint violation is
:class:`~app.storage.errors.Conflict`, a lost server or a full disk its storage problem
(:func:`storage_problem`). Nothing above the storage package knows which engine holds
the data (:func:`app.storage.engines.store_at` picks it from the setting).

Connections (psycopg 3): one writer connection per process, under the store's lock, as
SQLite's; job pushes that wait at the same time share one transaction (the same group
commit). Reads run on a small pool of their own (:data:`READ_POOL`), each in one
``REPEATABLE READ READ ONLY`` transaction, so a read that takes several statements sees
one snapshot while other replicas write.

Across replicas every write transaction is ``SERIALIZABLE``: PostgreSQL then lets
concurrent writers commit only as if they ran one after another, which is what SQLite's
single writer gave the table modules (read a step, decide idempotent or ``step_conflict``,
insert). The transaction that loses (``40001``, a deadlock, or a unique key inserted by a
concurrent one) is rolled back and run again from the start, up to :data:`ATTEMPTS`
times: the functions are re-runnable (the group commit already re-runs them alone), and
the second run sees what the winner committed.

Durability: PostgreSQL's commit (``synchronous_commit`` on, its default) returns after
its WAL is flushed; the service answers 2xx only after it. A commit cut off by a lost
connection is answered 503 ``storage_unavailable`` and may or may not have landed: the
client retries, and identical pushes are idempotent.

Faults: a database that cannot be reached, restarts or shuts down is 503
``storage_unavailable`` with ``Retry-After``; a full disk (``53100``) is 507
``storage_full``; readiness reports either until a write succeeds. Connections are made
again on the next use (the pool checks its own), so the service recovers by itself.
Reads fail as fast as writes in an outage: once a write, a read or the writer's
keepalive finds the server gone, the store is marked down and each read, instead of
waiting up to :data:`POOL_WAIT_S` for the pool, tries one connection of its own (refused
in milliseconds, as a write's); the first that connects clears the mark, reads on its
connection, and replaces the read pool, whose own reconnection backs off for up to a
minute after a long outage.

Schema: the tables are SQLite's current schema in PostgreSQL's types, stated in
:mod:`app.storage.postgres_schema` (a test checks that both engines hold the same tables
and columns), created (those missing) under a session advisory lock
(:data:`MIGRATION_LOCK`) at every start, and the version kept in ``datarax_schema``:
replicas starting together create them once; a database of a newer version, or one
holding other tables, is refused and left as it is.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from app.core.database_url import describe
from app.core.errors import ServiceError, StorageFull, StorageUnavailable
from app.storage.errors import Conflict, StoreClosed, StoreUnreachable, StoreUnusable
from app.storage.migrations import SCHEMA_VERSION
from app.storage.owners import OWNER, OWNER_CLASS
from app.storage.pg_arrays import packed
from app.storage.pg_arrays import register as register_packed
from app.storage.postgres_schema import SCHEMA
from app.storage.store import (
    RETRY_AFTER_S,
    Connection,
    Statement,
    Store,
    _Database,
    _GroupedWrite,
)

if TYPE_CHECKING:
    import psycopg
    import psycopg_pool

log = logging.getLogger("datarax.store")

T = TypeVar("T")

READ_POOL = 4
"""Most connections the service's store reads on at once, besides its one writer; the
compile-check store has a writer and 2 readers: at most 8 connections per replica."""
ATTEMPTS = 16
"""Runs of a write transaction that loses to a concurrent one before the loss is a 503
(``storage_unavailable``, not a storage fault: readiness stays ready)."""
BACKOFF_S = 0.2
"""Most time between two runs (jittered, growing from 2 ms)."""
CONNECT_TIMEOUT_S = 10
"""How long one connection attempt waits for the server."""
POOL_WAIT_S = 5
"""How long a read waits for a pooled connection (all busy) before it is a 503; with the
server gone it does not wait (module docstring, "Faults")."""
UNNEST_ROWS = 8
"""From this many rows, an insert's ``executemany`` is one statement over arrays
(the statement's :attr:`~app.storage.store.Statement.many`; an upsert's when no key
repeats); fewer go row by row in one pipeline."""
KEEPALIVE_S = 1.0
"""How often an idle writer connection is checked (``SELECT 1``) and made again when it
was lost: after a database restart, a replica holds its owner lock again within about
this long, without waiting for a write (:mod:`app.storage.owners`)."""
OWNER_GRACE_S = 3 * KEEPALIVE_S
"""How long a starting process waits before it fails work whose owner holds no lock: an
owner that lost its connection takes it again within :data:`KEEPALIVE_S`."""
MIGRATION_LOCK = 0x6461_7461_7261_7800  # "datarax\0": the advisory lock key of schema work
_BEGIN = "BEGIN ISOLATION LEVEL SERIALIZABLE"
"""A write transaction: see the module docstring."""
_RETRY = frozenset({"40001", "40P01"})
"""SQLSTATEs of a transaction that lost to a concurrent one: a serialization failure (also
what a unique key inserted first by a concurrent transaction is reported as, when this one
had read that the key was absent) or a deadlock."""


class _Connection:
    """A psycopg connection as the table modules see it (:class:`Connection`): each
    :class:`~app.storage.store.Statement` runs its PostgreSQL text, and many rows of an
    insert its array form (:attr:`~app.storage.store.Statement.many`); a constraint
    violation is :class:`Conflict`. A plain string is a statement in PostgreSQL's own
    words (this engine's internals, its tests)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.raw = conn
        self.changes = 0  # rows written through this wrapper (tells a write from a read)

    def execute(
        self, statement: Statement | str, params: Sequence[Any] = ()
    ) -> psycopg.Cursor[Any]:
        sql = statement if isinstance(statement, str) else statement.postgres
        if sql == "ROLLBACK":  # as sqlite3's: leaves the transaction, whatever happened
            _rollback(self)
            return self.raw.cursor()
        try:
            cursor = self.raw.execute(sql, tuple(params))
        except psycopg_errors().IntegrityError as err:
            raise _integrity(err) from err
        if cursor.rowcount > 0 and cursor.description is None:
            self.changes += cursor.rowcount
        return cursor

    def executemany(
        self, statement: Statement | str, rows: Iterable[Sequence[Any]]
    ) -> psycopg.Cursor[Any]:
        cursor = self.raw.cursor()
        rows = [tuple(row) for row in rows]
        sql = statement if isinstance(statement, str) else statement.postgres
        many = None if isinstance(statement, str) else statement.many
        arrays = many if len(rows) >= UNNEST_ROWS else None
        if arrays is not None and arrays.keys:  # an upsert may not touch one row twice
            keys = {tuple(row[i] for i in arrays.keys) for row in rows}
            arrays = arrays if len(keys) == len(rows) else None
        try:
            if arrays is not None:  # one statement, one array a column
                columns = [
                    packed(column, pg_type) or list(column)
                    for column, pg_type in zip(zip(*rows, strict=True), arrays.types, strict=True)
                ]
                cursor.execute(arrays.sql, columns)
            else:
                cursor.executemany(sql, rows)
        except psycopg_errors().IntegrityError as err:
            raise _integrity(err) from err
        self.changes += max(cursor.rowcount, 0)
        return cursor

    def executescript(self, script: Statement | str) -> None:
        text = script if isinstance(script, str) else script.postgres
        for statement in text.split(";"):  # the schema holds no ";" in literals
            if statement.strip():
                self.execute(statement.strip())

    @property
    def in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        if self.raw.closed or self.raw.broken:
            return False
        return self.raw.info.transaction_status != TransactionStatus.IDLE


def psycopg_errors() -> Any:
    """psycopg's module (imported when a PostgreSQL store is used, never before)."""
    import psycopg

    return psycopg


def _integrity(err: BaseException) -> Conflict:
    """A constraint violation as the store interface names it (:class:`Conflict`: a
    taken id)."""
    return Conflict(str(err).strip().splitlines()[0])


def _sqlstate(err: BaseException) -> str | None:
    return getattr(err, "sqlstate", None)


def _lost(err: BaseException) -> bool:
    """A lost, refused or shut-down connection (the server, not the statement)."""
    import psycopg

    state = _sqlstate(err) or ""
    return isinstance(err, (psycopg.OperationalError, psycopg.InterfaceError)) and (
        not state or state.startswith(("08", "57", "53"))
    )


def storage_problem(err: BaseException, where: str) -> ServiceError | None:
    """The problem a PostgreSQL failure answers with (507 full disk, 503 unreachable or
    refusing), or None for other errors (a statement's own fault: a bug)."""
    import psycopg
    import psycopg_pool

    if not isinstance(err, (psycopg.Error, psycopg_pool.PoolTimeout)):
        return None
    state = _sqlstate(err) or ""
    if state == "53100":
        return StorageFull(
            f"the database's disk is full ({where}); nothing was written. Free space on "
            "the database server, or delete jobs, plans or sessions you no longer need, and "
            "retry"
        )
    if isinstance(err, psycopg_pool.PoolTimeout) or _lost(err):
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return StorageUnavailable(
            f"the database cannot be reached or refused the work ({where}: {reason}); "
            "nothing was written. The service reconnects by itself: retry after the "
            "Retry-After seconds",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    return None


def _bool_dumper() -> type:
    """A psycopg dumper that sends ``bool`` as the integer SQLite stores (the schema has
    no boolean columns)."""
    from psycopg.adapt import Dumper
    from psycopg.postgres import types

    class BoolAsInt(Dumper):
        oid = types["int8"].oid

        def dump(self, obj: bool) -> bytes:
            return b"1" if obj else b"0"

    return BoolAsInt


class PostgresStore(Store):
    """The service's store in a PostgreSQL database (see the module docstring)."""

    dynamic_types = False

    def __init__(self, url: str, *, read_pool: int = READ_POOL) -> None:
        super().__init__(describe(url))  # answers name the database, never the URL
        self.contended = 0  # write transactions run again after losing to a concurrent one
        self.url = url
        self.read_pool = read_pool
        self._pool: psycopg_pool.ConnectionPool[Any] | None = None
        self._adapters: Any = None
        self._stop_keepalive = threading.Event()
        self._keepalive: threading.Thread | None = None
        self.owner_grace_s = OWNER_GRACE_S  # read by app.storage.owners.settle
        self.pool_wait_s: float = POOL_WAIT_S
        self.down = False  # the server was found gone: reads connect on their own
        self._pool_lock = threading.Lock()  # one read replaces the pool after an outage

    # ------------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Connects, creates the tables once (under the migration lock) and opens the
        read pool.

        Raises:
          StoreUnusable: the database cannot be reached, is newer, or holds other tables.
        """
        if self._db is not None:
            return
        import psycopg

        self._adapters = psycopg.adapt.AdaptersMap(psycopg.adapters)
        self._adapters.register_dumper(bool, _bool_dumper())
        register_packed(self._adapters)
        try:
            writer = self._writer_connection()
        except psycopg.Error as err:
            raise StoreUnreachable(f"cannot connect to {self.where}: {err}") from err
        try:
            self._create_schema(writer)
        except BaseException:
            writer.raw.close()
            raise
        self._pool = self._new_pool()
        self.down = False
        db = _Database(self.where, writer)
        self._lock = db.lock
        with db.lock:
            self._db, self._conn = db, writer
        self._stop_keepalive = threading.Event()
        self._keepalive = threading.Thread(
            target=self._keep_alive,
            args=(db, self._stop_keepalive),
            name="datarax-writer-keepalive",
            daemon=True,
        )
        self._keepalive.start()

    def _keep_alive(self, db: _Database, stop: threading.Event) -> None:
        """Every :data:`KEEPALIVE_S` while ``db`` is open: an idle writer is checked and,
        when lost, made again (with it this process's owner lock), connecting outside the
        lock so that writes and readiness never wait on a connection attempt. A writer in
        use is left alone: its write finds out, and makes it again, itself."""
        while not stop.wait(KEEPALIVE_S):
            if self._db is not db:
                return
            if not self._writer_lost(db):
                continue
            try:
                fresh: _Connection | None = self._writer_connection()
            except Exception as err:  # the server is down: tried again next time
                log.debug("writer keepalive: %s", err)
                self.down = self.down or _lost(err)
                continue
            with db.lock:
                current = cast(_Connection, db.conn)
                if self._db is db and (current.raw.closed or current.raw.broken):
                    db.conn = self._conn = fresh
                    fresh = None
            if fresh is not None:  # a write made one meanwhile, or the store closed
                fresh.raw.close()

    def _writer_lost(self, db: _Database) -> bool:
        """True when ``db``'s idle writer no longer answers (False while it is in use)."""
        if not db.lock.acquire(blocking=False):
            return False
        try:
            if self._db is not db:
                return False
            conn = cast(_Connection, db.conn)
            with contextlib.suppress(Exception):  # psycopg marks the connection broken
                if not (conn.raw.closed or conn.raw.broken):
                    conn.raw.execute("SELECT 1")
            return bool(conn.raw.closed or conn.raw.broken)
        finally:
            db.lock.release()

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        conn.adapters.register_dumper(bool, _bool_dumper())

    def _new_pool(self) -> psycopg_pool.ConnectionPool[Any]:
        """The read pool (connections checked by :meth:`_checked_out`, not the pool)."""
        import psycopg_pool

        return psycopg_pool.ConnectionPool(
            self.url,
            min_size=1,
            max_size=self.read_pool,
            kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_S},
            configure=self._configure,
            timeout=self.pool_wait_s,
            name="datarax-reads",
            open=True,
        )

    def _own_connection(self) -> psycopg.Connection[Any]:
        """A read connection of its own, as the pool makes them (raises when the server
        is gone, as fast as the writer's connection attempt)."""
        import psycopg

        raw = psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        self._configure(raw)
        return raw

    def _writer_connection(self) -> _Connection:
        """A new writer connection, holding this process's owner lock
        (:mod:`app.storage.owners`) for as long as it lives."""
        import psycopg

        raw = psycopg.connect(
            self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S, context=self._adapters
        )
        raw.execute("SELECT pg_advisory_lock_shared(%s, %s)", (OWNER_CLASS, OWNER))
        return _Connection(raw)

    def live_owners(self, conn: Connection) -> set[int]:
        """The service processes alive on this database: those holding their owner lock."""
        raw = cast(_Connection, conn).raw  # this engine's own statement: no SQLite text
        rows = raw.execute(
            "SELECT objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND classid::bigint = %s AND objsubid = 2",
            (OWNER_CLASS,),
        ).fetchall()
        return {int(row[0]) for row in rows} | {OWNER}

    def _create_schema(self, conn: _Connection) -> None:
        """Creates the tables when the database has none, once across replicas."""
        conn.raw.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
        try:
            tables = {row[0] for row in conn.raw.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")}  # fmt: skip
            if tables and "plans" not in tables:
                raise StoreUnusable(
                    f"{self.where} holds tables that are not this service's "
                    f"({', '.join(sorted(tables)[:5])}); it was left untouched: point "
                    "DATARAX_DATABASE_URL at a new database or at the service's own"
                )
            version = 0
            if "datarax_schema" in tables:
                row = conn.raw.execute("SELECT max(version) FROM datarax_schema").fetchone()
                version = int(row[0] or 0) if row else 0
            if version > SCHEMA_VERSION:
                raise StoreUnusable(
                    f"{self.where} has schema version {version}, newer than this service's "
                    f"{SCHEMA_VERSION}; it was left untouched: run the newer service"
                )
            # Every open, as SQLite's: tables added to the schema since are created too.
            with conn.raw.transaction():
                for statement in SCHEMA:
                    conn.raw.execute(statement)
                if version != SCHEMA_VERSION:
                    conn.raw.execute(
                        "CREATE TABLE IF NOT EXISTS datarax_schema (version BIGINT NOT NULL)"
                    )
                    conn.raw.execute("DELETE FROM datarax_schema")
                    conn.raw.execute(
                        "INSERT INTO datarax_schema (version) VALUES (%s)", (SCHEMA_VERSION,)
                    )
        finally:
            conn.raw.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))

    @property
    def schema_version(self) -> int:
        row = self._run(lambda c: c.execute("SELECT max(version) FROM datarax_schema").fetchone())
        return int(row[0]) if row is not None else 0

    def close(self) -> None:
        """Closes the writer and the read pool."""
        db, pool = self._db, self._pool
        if db is None:
            return
        self._stop_keepalive.set()
        if self._keepalive is not None:
            self._keepalive.join(timeout=30)
        with db.lock:
            self._db = self._conn = None
            self._pool = None
            try:
                cast(_Connection, db.conn).raw.close()
            except Exception:
                log.warning("closing the database connection failed", exc_info=True)
        if pool is not None:
            pool.close()

    # ------------------------------------------------------------------------ faults

    def _problem(self, err: BaseException) -> tuple[ServiceError | None, str]:
        """PostgreSQL's problem of a failure (:func:`storage_problem`) and its reason."""
        reason = f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
        return storage_problem(err, self.where), reason

    # ------------------------------------------------------------------------ plumbing

    def _writer(self) -> _Connection:
        """The writer connection, made again when the last one was lost (lock held)."""
        db = self._db
        if db is None:
            raise StoreClosed("the store is not open")
        conn = cast(_Connection, db.conn)
        if conn.raw.closed or conn.raw.broken:
            conn = self._writer_connection()
            db.conn = self._conn = conn
        return conn

    def _write_locked(self, fn: Callable[[_Connection], T]) -> T:
        """``fn`` in one SERIALIZABLE transaction, run again when it loses to a concurrent
        one; returns after the durable commit (the lock held)."""
        for attempt in range(1, ATTEMPTS + 1):
            try:
                conn = self._writer()
            except Exception as err:
                raise self._fault_or(err) from err
            before = conn.changes
            try:
                conn.execute(_BEGIN)
            except Exception as err:
                # Nothing was sent of this transaction: a connection lost while idle (a
                # restarted server, a terminated backend) is made again once, at once.
                conn.raw.close()
                if attempt < ATTEMPTS and _lost(err):
                    continue
                raise self._fault_or(err) from err
            try:
                result = fn(conn)
                conn.execute("COMMIT")
            except BaseException as err:
                _rollback(conn)
                if _sqlstate(err) in _RETRY:
                    if attempt == ATTEMPTS:
                        raise _contended(err, self.where) from err
                    self.contended += 1
                    time.sleep(random.uniform(0, min(BACKOFF_S, 0.002 * 2**attempt)))
                    continue
                raise self._fault_or(err) from err
            if conn.changes != before:
                self._succeeded()
            return result
        raise AssertionError("unreachable")  # the last attempt returns or raises

    def _writer_view(self) -> _Connection:
        return self._writer()

    def _commit_group(self, group: list[_GroupedWrite]) -> None:
        """The group commit, with the group's keys (jobs) locked first across processes:
        pushes of one job from several replicas then queue instead of failing each other's
        serializable transactions. Session advisory locks, taken in key order before
        ``BEGIN`` (inside the transaction its snapshot would predate the wait) and
        released after the commit. A writer lost while idle (a restarted server) is made
        again once, at once, as :meth:`_write_locked` does: nothing was sent yet."""
        keys = sorted({write.key for write in group if write.key is not None})
        for attempt in (1, 2):
            try:
                writer = self._writer()
                for key in keys:
                    writer.raw.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (key,))
                break
            except Exception as err:
                if attempt == 1 and _lost(err) and self._conn is not None:
                    self._conn.raw.close()
                    continue
                problem = self._fault_or(err)
                for write in group:
                    write.finish(error=problem)
                return
        try:
            self._commit_on(writer, group)
        finally:
            with contextlib.suppress(Exception):  # a lost connection released them
                for key in keys:
                    writer.raw.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))

    def _leave_transaction(self, conn: _Connection) -> None:
        _rollback(conn)

    def _fault_or(self, err: BaseException) -> BaseException:
        problem = self._failed(err)
        return err if problem is None else problem

    def _run(self, fn: Callable[[_Connection], T]) -> T:
        """``fn`` on a pooled connection in autocommit mode (each statement its own
        transaction): the compile store's statements that stand alone."""
        return self._pooled(fn, snapshot=False)

    async def read(self, fn: Callable[[_Connection], T]) -> T:
        """``fn`` in one read-only snapshot on a pooled connection, in a worker thread."""
        return await self._in_thread(lambda: self._pooled(fn, snapshot=True))

    def _pooled(self, fn: Callable[[_Connection], T], *, snapshot: bool) -> T:
        if self._pool is None:
            raise StoreClosed("the store is not open")
        try:
            with self._read_connection() as raw:
                conn = _Connection(raw)
                if not snapshot:
                    result = fn(conn)
                else:
                    raw.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    try:
                        result = fn(conn)
                    finally:
                        _rollback(conn)
        except ServiceError:
            raise
        except Exception as err:
            raise self._fault_or(err) from err
        if conn.changes:
            self._succeeded()
        return result

    def _failed(self, err: BaseException) -> ServiceError | None:
        """As the store's, and a server found gone (not a busy pool) marks it down."""
        import psycopg_pool

        problem = super()._failed(err)
        gone = _lost(err) and not isinstance(err, psycopg_pool.PoolTimeout)
        if gone and problem is not None and problem.code == "storage_unavailable":
            self.down = True
        return problem

    @contextlib.contextmanager
    def _read_connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection; while the server is marked down, one of the read's own
        (the first that connects clears the mark and replaces the pool)."""
        pool, raw = self._checked_out()
        try:
            yield raw
        finally:
            if pool is None:
                raw.close()
            else:
                pool.putconn(raw)

    def _checked_out(
        self,
    ) -> tuple[psycopg_pool.ConnectionPool[Any] | None, psycopg.Connection[Any]]:
        """``(pool, connection)`` checked to answer, or ``(None, connection)`` of the
        read's own after an outage.

        Raises:
          psycopg.Error: the server is gone (refused at once) or the pool stayed busy
            for :attr:`pool_wait_s`.
        """
        import psycopg_pool

        deadline = time.monotonic() + self.pool_wait_s
        while True:
            pool = self._pool
            if pool is None:
                raise StoreClosed("the store is not open")
            if self.down:
                return None, self._reconnected()
            try:
                raw = pool.getconn(timeout=max(0.0, deadline - time.monotonic()))
            except psycopg_pool.PoolClosed:
                continue  # replaced meanwhile: the new one
            try:
                raw.execute("")
                return pool, raw
            except Exception as err:  # lost since it was pooled: is the server gone?
                pool.putconn(raw)  # discarded, and replaced in the background
                try:
                    self._own_connection().close()
                except Exception:
                    self.down = True
                    raise err from None

    def _reconnected(self) -> psycopg.Connection[Any]:
        """The read's own connection while the server is marked down; the first that
        connects clears the mark and starts a fresh pool (the old one's reconnection
        may be backing off for a minute)."""
        raw = self._own_connection()  # raises while the server is gone
        with self._pool_lock:
            if self.down and self._pool is not None:
                old, self._pool = self._pool, self._new_pool()
                self.down = False
                threading.Thread(target=old.close, name="datarax-old-reads", daemon=True).start()
        return raw


def _contended(err: BaseException, where: str) -> ServiceError:
    """The 503 of a write that lost to concurrent ones :data:`ATTEMPTS` times: the
    database works, so it is not a storage fault."""
    return StorageUnavailable(
        f"the database ({where}) refused this write {ATTEMPTS} times for concurrent writes "
        f"of the same rows by other service processes ({str(err).strip().splitlines()[0]}); "
        "nothing was written: retry",
        headers={"Retry-After": "1"},
    )


def _rollback(conn: _Connection) -> None:
    """Leaves ``conn`` outside any transaction; a lost connection needs no rollback."""
    try:
        if not conn.raw.closed and conn.in_transaction:
            conn.raw.execute("ROLLBACK")
    except Exception:
        log.debug("ROLLBACK failed on the database", exc_info=True)
