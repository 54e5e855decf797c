"""The PostgreSQL engine (app/storage/postgres.py) on a real PostgreSQL the tests start
(tests/postgres_fixtures.py): schema once across replicas, refusals, serializable writes
across stores, idempotency and conflicts across them, lost connections and faults."""

from __future__ import annotations

import threading

import anyio
import psycopg
import pytest

from app.core.database_url import redact
from app.core.errors import StepConflict, StorageUnavailable
from app.storage import calibrations, plans, postgres
from app.storage import jobs as store_jobs
from app.storage.engines import store_at
from app.storage.errors import Conflict, StoreUnusable
from app.storage.migrations import SCHEMA_VERSION
from app.storage.postgres import PostgresStore
from app.storage.store import ArrayInsert, Statement


def _point(step: int, reduced: str) -> store_jobs.PushItem:
    return store_jobs.PushItem(
        step=step, source="", sources=1, digest=reduced, num_devices=1, reduced=reduced
    )


@pytest.fixture
def replicas(postgres_url):
    """Two stores on one database: two service processes' stores, as far as PostgreSQL
    can tell (each its own writer connection and read pool)."""
    stores = [PostgresStore(postgres_url) for _ in range(2)]
    for store in stores:
        store.open()
    yield stores
    for store in stores:
        store.close()


def test_store_at_picks_the_engine_by_location(tmp_path):
    assert isinstance(store_at("postgresql://u@h/db"), PostgresStore)
    assert isinstance(store_at("postgres://u@h/db"), PostgresStore)
    assert not isinstance(store_at(tmp_path / "x.sqlite"), PostgresStore)
    assert redact("postgresql://user:s3cret@db:5432/x") == "postgresql://user:***@db:5432/x"
    assert redact("postgresql://user@db/x") == "postgresql://user@db/x"


def test_replicas_starting_together_create_the_schema_once(postgres_url):
    stores = [PostgresStore(postgres_url) for _ in range(4)]
    errors: list[BaseException] = []

    def start(store: PostgresStore) -> None:
        try:
            store.open()
        except BaseException as err:  # collected: the assertion names it
            errors.append(err)

    threads = [threading.Thread(target=start, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        assert all(s.schema_version == SCHEMA_VERSION for s in stores)
        with psycopg.connect(postgres_url) as conn:
            assert conn.execute("SELECT count(*) FROM datarax_schema").fetchone()[0] == 1
            tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables")}
        assert {"plans", "jobs", "job_points", "job_segments", "compile_checks"} <= tables
    finally:
        for s in stores:
            s.close()


def test_a_database_of_other_tables_or_a_newer_version_is_left_untouched(postgres_url):
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE invoices (id int)")
    with pytest.raises(StoreUnusable, match="not this service's"):
        PostgresStore(postgres_url).open()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        tables = {
            r[0]
            for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        }
        assert tables == {"invoices"}
        conn.execute("DROP TABLE invoices")
    store = PostgresStore(postgres_url)
    store.open()
    store.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("UPDATE datarax_schema SET version = %s", (SCHEMA_VERSION + 1,))
    with pytest.raises(StoreUnusable, match="newer"):
        PostgresStore(postgres_url).open()


def test_what_one_replica_acknowledges_the_other_reads(replicas):
    a, b = replicas
    a.write_here(lambda c: store_jobs.push(c, "j", [_point(0, '{"loss":1.0}')], "t0", None))
    b.write_here(lambda c: store_jobs.push(c, "j", [_point(1, '{"loss":0.5}')], "t1", None))
    for store in replicas:
        got = _all(
            store, "SELECT step, reduced FROM job_points WHERE job = %s ORDER BY step", ("j",)
        )
        assert got == [(0, '{"loss":1.0}'), (1, '{"loss":0.5}')]
        job = _one(store, "SELECT points, first_step, last_step FROM jobs WHERE job = %s", ("j",))
        assert job == (2, 0, 1)


def _all(store, sql: str, params: tuple = ()) -> list[tuple]:
    return anyio.run(store.read, lambda c: c.execute(sql, params).fetchall())


def _one(store, sql: str, params: tuple = ()) -> tuple:
    return anyio.run(store.read, lambda c: c.execute(sql, params).fetchone())


def _race(stores, fns):
    """Runs ``fns[i]`` on ``stores[i]`` at once (a barrier before each); their outcomes."""
    barrier = threading.Barrier(len(fns))
    outcomes: list[object] = [None] * len(fns)

    def run(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = stores[i].write_here(fns[i])
        except BaseException as err:  # the outcome under test
            outcomes[i] = err

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def test_the_same_step_pushed_to_two_replicas_at_once_is_stored_once(replicas):
    for step in range(20):  # twenty races: the interleavings vary
        push = lambda c, s=step: store_jobs.push(c, "same", [_point(s, '{"x":1}')], "t", None)  # noqa: E731
        outcomes = _race(replicas, [push, push])
        assert not any(isinstance(o, BaseException) for o in outcomes), outcomes
    rows = _one(
        replicas[0], "SELECT count(*), count(DISTINCT step) FROM job_points WHERE job = 'same'"
    )
    assert rows == (20, 20)
    points = _one(replicas[1], "SELECT points FROM jobs WHERE job = 'same'")[0]
    assert points == 20  # each step counted once, though both replicas acknowledged it


def test_other_content_for_a_step_is_a_conflict_from_whichever_replica_loses(replicas):
    for step in range(20):
        fns = [
            lambda c, s=step, v=v: store_jobs.push(c, "c", [_point(s, f'{{"x":{v}}}')], "t", None)
            for v in (1, 2)
        ]
        outcomes = _race(replicas, fns)
        conflicts = [o for o in outcomes if isinstance(o, StepConflict)]
        assert len(conflicts) == 1, outcomes
        assert not any(isinstance(o, BaseException) and not isinstance(o, StepConflict)
                       for o in outcomes)  # fmt: skip
    assert anyio.run(replicas[0].read, lambda c: c.execute(
        "SELECT count(*) FROM job_points WHERE job = 'c'").fetchone()[0]) == 20  # fmt: skip


def test_grouped_writes_commit_together_and_a_conflict_is_rolled_back_alone(postgres_url):
    store = PostgresStore(postgres_url)
    store.open()
    try:
        store.write_here(lambda c: store_jobs.push(c, "g", [_point(0, '{"a":0}')], "t0", None))
        ok = lambda c: store_jobs.push(c, "g", [_point(1, '{"a":1}')], "t1", None)  # noqa: E731
        bad = lambda c: store_jobs.push(c, "g", [_point(0, '{"a":9}')], "t1", None)  # noqa: E731
        results: list[object] = []

        async def both() -> None:
            async def one(fn) -> None:
                try:
                    results.append(await store.write_grouped(fn))
                except StepConflict as err:
                    results.append(err)

            async with anyio.create_task_group() as tg:
                tg.start_soon(one, ok)
                tg.start_soon(one, bad)

        anyio.run(both)
        assert sum(isinstance(r, StepConflict) for r in results) == 1
        stored = _all(store, "SELECT step, reduced FROM job_points WHERE job = 'g' ORDER BY step")
        assert stored == [(0, '{"a":0}'), (1, '{"a":1}')]
    finally:
        store.close()


def test_a_taken_id_is_an_integrity_error_as_with_sqlite(replicas):
    a, b = replicas
    args = ("p1", "2026-01-01T00:00:00Z", "jobs", "tpu", None, "{}")
    anyio.run(calibrations.insert_profile, a, *args)
    with pytest.raises(Conflict):
        anyio.run(calibrations.insert_profile, b, *args)
    # the failed write left b's writer usable
    anyio.run(calibrations.insert_profile, b, "p2", *args[1:])
    assert len(anyio.run(calibrations.list_profiles, a)) == 2


def test_plans_list_newest_first_across_replicas(replicas):
    a, b = replicas
    for i, store in enumerate([a, b, a]):
        anyio.run(plans.insert_plan, store, f"plan-{i}", "2026-01-01", None, False,
                  f'{{"n": {i}}}', f'{{"s": {i}}}')  # fmt: skip
    listed, total = anyio.run(lambda: plans.list_plans(b, 10, 0, summary=True))
    assert total == 3
    assert listed == ['{"s": 2}', '{"s": 1}', '{"s": 0}']
    assert anyio.run(plans.get_plan, b, "plan-0") == '{"n": 0}'


def test_a_lost_connection_is_made_again_and_a_stopped_server_is_503(own_postgres):
    url = own_postgres.create_database()
    store = PostgresStore(url)
    store.open()
    try:
        store.write_here(lambda c: store_jobs.push(c, "r", [_point(0, '{"a":0}')], "t", None))
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        # the writer's connection was cut while idle: made again, the write lands
        store.write_here(lambda c: store_jobs.push(c, "r", [_point(1, '{"a":1}')], "t", None))
        assert store.health() is None
        own_postgres.stop()
        with pytest.raises(StorageUnavailable) as caught:
            store.write_here(lambda c: store_jobs.push(c, "r", [_point(2, '{"a":2}')], "t", None))
        assert caught.value.headers.get("Retry-After")
        with pytest.raises(StorageUnavailable):
            anyio.run(store.read, lambda c: c.execute("SELECT 1").fetchone())
        fault = store.fault
        assert fault is not None and fault.code == "storage_unavailable"
        own_postgres.restart()
        store.write_here(lambda c: store_jobs.push(c, "r", [_point(2, '{"a":2}')], "t", None))
        assert store.fault is None
        got = _one(store, "SELECT count(*) FROM job_points WHERE job = 'r'")[0]
        assert got == 3
    finally:
        store.close()


def test_replicas_pushing_one_job_at_once_queue_and_never_fault(postgres_url):
    """Three stores' grouped pushes to one job: each waits for the job's lock, none is
    refused, and no store records a fault (readiness would say 503)."""
    stores = [PostgresStore(postgres_url) for _ in range(3)]
    for store in stores:
        store.open()
    try:
        errors: list[BaseException] = []

        def pusher(i: int) -> None:
            store = stores[i]
            for n in range(15):
                first = (n * 3 + i) * 10
                items = [_point(s, f'{{"x":{s}}}') for s in range(first, first + 10)]
                try:
                    store.write_grouped_here(
                        lambda c, items=items: store_jobs.push(c, "one", items, "t", None),
                        key="job:one",
                    )
                except BaseException as err:  # collected: the assertion names it
                    errors.append(err)

        threads = [threading.Thread(target=pusher, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert all(s.fault is None for s in stores)
        assert _one(stores[0], "SELECT points FROM jobs WHERE job = 'one'") == (450,)
        print(f"transactions run again after losing: {[s.contended for s in stores]}")
    finally:
        for store in stores:
            store.close()


def test_many_rows_of_an_insert_or_upsert_are_one_statement_and_store_the_same(postgres_url):
    """From UNNEST_ROWS rows, an insert goes as one statement over arrays: the rows
    stored are those the row-by-row path stores (NULLs, bytes, floats, literals), a taken
    key is still an integrity error, and a push of many steps goes over arrays too and
    reads back whole."""
    first = PostgresStore(postgres_url)
    first.open()  # the service's tables, then one more
    first.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE many_rows (k TEXT NOT NULL, n BIGINT NOT NULL, x DOUBLE PRECISION, "
            "b BYTEA, fixed BIGINT NOT NULL, PRIMARY KEY (k, n))"
        )
    store = PostgresStore(postgres_url)
    store.open()
    sent: list[str] = []
    plain_execute = psycopg.Cursor.execute

    def recorded(self, query, params=None, **kwargs):
        sent.append(str(query))
        return plain_execute(self, query, params, **kwargs)

    try:
        insert = Statement(
            "INSERT INTO many_rows (k, n, x, b, fixed) VALUES (?, ?, ?, ?, 7)",
            "INSERT INTO many_rows (k, n, x, b, fixed) VALUES (%s, %s, %s, %s, 7)",
            ArrayInsert(
                "INSERT INTO many_rows (k, n, x, b, fixed) SELECT u.c0, u.c1, u.c2, u.c3, 7 "
                "FROM unnest(%b::text[], %b::bigint[], %b::double precision[], %b::bytea[]) "
                "AS u(c0, c1, c2, c3)",
                ("text", "bigint", "double precision", "bytea"),
            ),
        )
        rows = [
            (key, n, None if n % 3 else n / 4, None if n % 2 else bytes([n, 0, 255]))
            for key, count in (("arrays", postgres.UNNEST_ROWS + 5), ("rows", 3))
            for n in range(count)
        ]
        arrays = [r for r in rows if r[0] == "arrays"]
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(psycopg.Cursor, "execute", recorded)
            store.write_here(lambda c: c.executemany(insert, arrays))
            assert sum("unnest(" in q for q in sent) == 1
            store.write_here(lambda c: c.executemany(insert, [r for r in rows if r[0] == "rows"]))
            assert sum("unnest(" in q for q in sent) == 1
            got = _all(store, "SELECT k, n, x, b, fixed FROM many_rows ORDER BY k, n")
            assert got == [(k, n, x, b, 7) for k, n, x, b in sorted(rows)]
            with pytest.raises(Conflict):
                store.write_here(lambda c: c.executemany(insert, arrays))
            # an upsert: over arrays when its keys are distinct, row by row when one repeats
            conflict = (
                "ON CONFLICT (k, n) DO UPDATE SET fixed = m.fixed + 1, x = {}(m.x, excluded.x)"
            )
            into = "INSERT INTO many_rows AS m (k, n, x, b, fixed)"
            upsert = Statement(
                f"{into} VALUES (?, ?, ?, ?, 7) {conflict.format('max')}",
                f"{into} VALUES (%s, %s, %s, %s, 7) {conflict.format('greatest')}",
                ArrayInsert(
                    f"{into} SELECT u.c0, u.c1, u.c2, u.c3, 7 FROM unnest(%b::text[], "
                    "%b::bigint[], %b::double precision[], %b::bytea[]) AS u(c0, c1, c2, c3) "
                    + conflict.format("greatest"),
                    ("text", "bigint", "double precision", "bytea"),
                    (0, 1),
                ),
            )
            sent.clear()
            store.write_here(lambda c: c.executemany(upsert, arrays))
            store.write_here(lambda c: c.executemany(upsert, arrays + arrays[:1]))
            assert sum("unnest(" in q for q in sent) == 1
            got = _all(store, "SELECT n, x, fixed FROM many_rows WHERE k = 'arrays' ORDER BY n")
            assert got == [(r[1], r[2], 9 + (r[1] == 0)) for r in arrays]
            sent.clear()
            items = [_point(step, f'{{"loss":{step}}}') for step in range(40)]
            store.write_here(lambda c: store_jobs.push(c, "many", items, "t0", None))
            assert any("unnest(" in q and "job_points" in q for q in sent)
        got = _all(
            store, "SELECT step, reduced FROM job_points WHERE job = %s ORDER BY step", ("many",)
        )
        assert got == [(i.step, i.reduced) for i in items]
    finally:
        store.close()
