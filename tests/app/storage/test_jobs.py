"""The job tables' writes: grouped commits, retries against older digests, migrated
parts completing, pushes mixing whole steps and parts, and the typed functions the
services call."""

from __future__ import annotations

import json

import numpy as np
import pytest

from app.services.jobs.decode import PointInput
from app.services.jobs.parts import PART_RULES
from app.services.jobs.rows import build_items
from app.storage import jobs as store_jobs
from app.storage import migrations
from app.storage import parts as store_parts
from app.storage.db import SCHEMA_VERSION, Store
from tests.app.storage.conftest import statements_sent


def _point(step: int, reduced: str) -> store_jobs.PushItem:
    return store_jobs.PushItem(
        step=step, source="", sources=1, digest=reduced, num_devices=1, reduced=reduced
    )


def test_grouped_writes_share_one_commit_and_a_failing_one_is_rolled_back_alone(store):
    import threading

    from app.core.errors import StepConflict

    store._write(lambda c: store_jobs.push(c, "g", [_point(0, '{"a":0}')], "t0", None))
    batches = [
        [_point(step, f'{{"a":{step}}}') for step in (2 * i + 1, 2 * i + 2)] for i in range(8)
    ]
    batches[3] = [_point(100, '{"a":100}'), _point(0, '{"a":"other"}')]  # a conflict: 409
    outcomes: dict[int, object] = {}

    def push(i):
        try:
            outcomes[i] = store._write_grouped(
                lambda c: store_jobs.push(c, "g", batches[i], "t1", None)
            )
        except StepConflict as err:
            outcomes[i] = err

    with statements_sent(store) as sent:
        with store._lock:  # every write queues behind this: one group takes them all
            threads = [threading.Thread(target=push, args=(i,)) for i in range(8)]
            for thread in threads:
                thread.start()
            while len(store._group) < 8:
                threading.Event().wait(0.001)
        for thread in threads:
            thread.join()
    assert [sql for sql in sent if sql == "COMMIT"] == ["COMMIT"]
    assert isinstance(outcomes.pop(3), StepConflict)
    assert all(result == 0 for result in outcomes.values())
    page, _ = store._run(lambda c: store_jobs.history_page(c, "g", 0, 1000, 1000, False))
    stored = [p.step for p in page]
    assert stored == [0, *(s for i in range(8) if i != 3 for s in (2 * i + 1, 2 * i + 2))]
    assert [p.reduced for p in page][0] == '{"a":0}'
    job = store._run(lambda c: store_jobs.get_job(c, "g"))
    assert job.points == len(stored)  # the refused batch left nothing, not even counts


def test_a_version_3_file_with_pending_parts_completes_them_after_migration(tmp_path):
    """Version 3 kept parts one row per (step, source) in ``job_parts`` (npz bytes before
    2026-12-01, the compact format after) and ``job_pending``; version 4 turns them into
    segments: the pending parts merge with the parts pushed after the upgrade, a retry of
    a migrated part is a no-op, and a fourth source is refused."""
    import sqlite3

    from app.codecs.npz import encode_npz
    from app.storage.part_blobs import encode_part

    def part(source, loss):
        point = PointInput(7, {"loss": np.array(loss)}, {}, None, "propagate", source, 3)
        return build_items([point])

    path = tmp_path / "v3.sqlite"
    store = Store(path)
    store.open()
    store.close()
    conn = sqlite3.connect(path)  # back to what a version-3 service left
    conn.execute("DROP TABLE job_segments")
    for statement in (migrations.SCHEMA_V2 + ";" + migrations.SCHEMA_V3).split(";"):
        if statement.strip():
            conn.execute(statement)
    signature = part("host-0", [1.0, 2.0])[0].signature
    rows = [
        ("host-0", encode_npz({"loss": np.array([1.0, 2.0])})),  # a part stored as npz
        ("host-1", encode_part({"loss": np.array([3.0, 4.0])})),
    ]
    for source, blob in rows:
        conn.execute(
            "INSERT INTO job_parts VALUES ('old', 7, ?, 3, 'legacy', ?, 2, ?, 't0')",
            (source, signature, blob),
        )
    conn.execute("INSERT INTO job_pending VALUES ('old', 7, 3, ?, 2, 2)", (signature,))
    conn.execute("INSERT INTO jobs (job, created_at, last_push_at) VALUES ('old', 't0', 't0')")
    conn.execute("PRAGMA user_version = 3")
    conn.commit()
    conn.close()

    store = Store(path)
    store.open()
    try:
        assert store.schema_version == SCHEMA_VERSION
        tables = store._run(
            lambda c: {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        )
        assert "job_parts" not in tables and "job_pending" not in tables
        job = store._run(lambda c: store_jobs.get_job(c, "old"))
        assert (job.incomplete_step, job.received_sources) == (7, ["host-0", "host-1"])
        retry = part("host-1", [3.0, 4.0])
        store._write(lambda c: store_jobs.push(c, "old", retry, "t1", PART_RULES))
        assert retry[0].created is False and retry[0].complete is False
        assert retry[0].missing == ["host-2"]
        changed = part("host-1", [3.0, 5.0])
        with pytest.raises(Exception, match="stored with other content"):
            store._write(lambda c: store_jobs.push(c, "old", changed, "t1", PART_RULES))
        last = part("host-2", [5.0, 6.0])
        store._write(lambda c: store_jobs.push(c, "old", last, "t2", PART_RULES))
        assert last[0].complete and json.loads(last[0].step_reduced) == {"loss": 3.5}
        late = part("host-3", [5.0, 6.0])
        with pytest.raises(Exception, match="already has all 3 sources"):
            store._write(lambda c: store_jobs.push(c, "old", late, "t3", PART_RULES))
        open_parts = store._run(
            lambda c: c.execute(
                "SELECT COUNT(*) FROM job_segments WHERE pending > 0 OR arrays IS NOT NULL"
            ).fetchone()
        )
        assert open_parts == (0,)
    finally:
        store.close()


def test_a_step_stored_with_an_older_digest_is_compared_by_its_values(store):

    def point(loss):
        return build_items([PointInput(3, {"loss": np.array(loss)}, {}, None, "propagate")])

    first = point([1.0, 3.0])
    first[0].digest = "0" * 32  # a blake2b digest, as stored before 2026-12-01
    store._write(lambda c: store_jobs.push(c, "old-digest", first, "t0", PART_RULES))
    retry = point([1.0, 3.0])
    assert retry[0].digest.startswith("r") and len(retry[0].digest) == 17
    store._write(lambda c: store_jobs.push(c, "old-digest", retry, "t1", PART_RULES))
    assert retry[0].created is False and retry[0].complete
    with pytest.raises(Exception, match="stored with other content"):
        other = point([1.0, 5.0])
        store._write(lambda c: store_jobs.push(c, "old-digest", other, "t2", PART_RULES))


def test_a_push_holding_a_step_whole_and_as_a_part_is_refused(store):
    from app.core.errors import SourcesMismatch

    whole = PointInput(9, {"loss": np.array([1.0, 2.0])}, {}, None, "propagate")
    part = PointInput(9, {"loss": np.array([3.0])}, {}, None, "propagate", "host-0", 2)
    items = build_items([whole, part])
    with pytest.raises(SourcesMismatch):
        store._write(lambda c: store_jobs.push(c, "mixed", items, "t0", PART_RULES))
    assert store._run(lambda c: store_jobs.get_job(c, "mixed")) is None  # nothing stored


def _columns(steps, loss) -> store_jobs.PointColumns:
    values = {"loss": np.asarray(loss, dtype=np.float64)}
    texts = [json.dumps({"loss": v}) for v in loss]
    return store_jobs.PointColumns(
        steps=list(steps),
        digests=[f"d{s}" for s in steps],
        reduced=texts,
        values=values,
        num_devices=2,
    )


def test_a_batch_of_columns_is_stored_straight_or_as_items_on_a_retry(store):
    batch = store_jobs.PushBatch(columns=_columns([1, 2, 3], [1.0, 2.0, 3.0]))
    first = store_jobs.store_batch_here(store, "c", batch)
    assert (first.points, first.created, first.completed, first.items) == (3, 3, 3, [])
    retry = store_jobs.store_batch_here(store, "c", batch)
    assert (retry.created, retry.completed, len(retry.items)) == (0, 0, 3)
    assert retry.received_at == first.received_at  # the stored time, not the retry's
    job = store._run(lambda c: store_jobs.get_job(c, "c"))
    assert (job.points, job.first_step, job.last_step) == (3, 1, 3)


def test_parts_as_one_segment_complete_with_the_other_source(store):
    def segment(source, loss):
        return store_parts.PartSegment(
            source=source,
            sources=2,
            signature='{"metrics":{"loss":[]},"nan_policy":"propagate","reduce":{"loss":"sum"}}',
            num_devices=1,
            steps=[0, 1],
            columns={"loss": np.asarray(loss, dtype=np.float64).reshape(2, 1)},
        )

    half = store_jobs.store_batch_here(
        store, "s", store_jobs.PushBatch(parts=segment("a", [1, 2])), PART_RULES
    )
    assert (half.points, half.created, half.completed) == (2, 2, 0)
    done = store_jobs.store_batch_here(
        store, "s", store_jobs.PushBatch(parts=segment("b", [3, 4])), PART_RULES
    )
    assert (done.created, done.completed) == (2, 2)
    page, _ = store._run(lambda c: store_jobs.history_page(c, "s", 0, 10, 10, False))
    assert [json.loads(p.reduced) for p in page] == [{"loss": 4.0}, {"loss": 6.0}]


def test_the_typed_writes_run_in_the_stores_transactions(store):
    import anyio

    items = [_point(0, '{"a":1}'), _point(1, '{"a":2}')]
    outcome = anyio.run(store_jobs.store_points, store, "t", items)
    assert (outcome.points, outcome.created, outcome.completed) == (2, 2, 2)
    assert all(i.created and i.complete for i in outcome.items)
    assert anyio.run(store_jobs.mark_finished, store, "t", True) is True
    assert anyio.run(store_jobs.mark_finished, store, "nope", True) is False
    assert anyio.run(store_jobs.expire_pushed_before, store, "0000") == []
    assert anyio.run(store_jobs.expire_pushed_before, store, "9999") == ["t"]
    assert anyio.run(store_jobs.remove_job, store, "t") is False  # expired already


def test_parts_without_the_services_merge_rules_are_refused(store):
    # Storage never imports the jobs service: a push of parts must be handed its rules.
    part = store_parts.PartSegment(
        source="a",
        sources=2,
        signature='{"metrics":{"loss":[]},"nan_policy":"propagate","reduce":{"loss":"sum"}}',
        num_devices=1,
        steps=[0],
        columns={"loss": np.ones((1, 1))},
    )
    with pytest.raises(ValueError, match="merge rules"):
        store_jobs.store_batch_here(store, "r", store_jobs.PushBatch(parts=part))
    outcome = store_jobs.store_batch_here(store, "r", store_jobs.PushBatch(parts=part), PART_RULES)
    assert (outcome.created, outcome.completed) == (1, 0)
