"""The job tables: rollup segments, downsampled reads against a brute-force answer."""

from __future__ import annotations

import json
import math

import anyio
import numpy as np
import pytest

from app.storage import jobs as store_jobs
from app.storage import migrations
from app.storage import parts as store_parts
from app.storage.db import SCHEMA_VERSION, Store


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "jobs.sqlite")
    s.open()
    yield s
    s.close()


def _items(steps, values):
    return [
        store_jobs.PushItem(
            step=int(step),
            source="",
            sources=1,
            digest=str(step),
            num_devices=1,
            reduced=json.dumps({"loss": None if math.isnan(v) else v, "vec": [1, 2]}),
            values={"loss": float(v)},
        )
        for step, v in zip(steps, values, strict=True)
    ]


@pytest.mark.parametrize(
    ("low", "high", "top"),
    [(0, 0, 0), (3, 70000, 4), (17, 300, 1), (256, 511, 2), (5, 4100, 3)],
    ids=["one-step", "all-levels", "level-1", "aligned", "level-3"],
)
def test_segments_cover_the_range_exactly_once(low, high, top):
    covered = []
    for level, first, last in store_jobs._segments(low, high, top):
        size = 16**level
        covered += [(first * size, (last + 1) * size - 1)]
    assert covered[0][0] == low and covered[-1][1] == high
    assert all(a[1] + 1 == b[0] for a, b in zip(covered, covered[1:], strict=False))
    assert len(covered) <= 2 * top + 1


def test_downsampled_buckets_equal_brute_force(store):
    rng = np.random.default_rng(0)
    steps = np.sort(rng.choice(np.arange(20000), size=6000, replace=False))
    values = rng.normal(size=steps.size)
    values[rng.choice(steps.size, 50, replace=False)] = np.nan  # NaN steps count nowhere
    items = _items(steps, values)
    for start in range(0, len(items), 1000):  # several batches: blocks merge across them
        chunk = items[start : start + 1000]
        anyio.run(store.write, lambda c, b=chunk: store_jobs.push(c, "j", b, "t", None))
    for low, high, max_points in [(0, 19999, 100), (123, 17777, 37), (5000, 5100, 10)]:
        width, buckets = anyio.run(
            store.read,
            lambda c, a=low, b=high, m=max_points: store_jobs.downsample(c, "j", a, b, m),
        )
        assert len(buckets) <= max_points
        for bucket in buckets:
            inside = (steps >= bucket.start) & (steps <= bucket.end)
            assert bucket.start >= low and bucket.end <= high
            assert bucket.end - bucket.start + 1 <= width
            kept = values[inside]
            finite = kept[np.isfinite(kept)]
            n, total, lo, hi, last_step, last = bucket.metrics["loss"]
            assert n == finite.size
            assert total == pytest.approx(finite.sum())
            assert (lo, hi) == (finite.min(), finite.max())
            assert last_step == steps[inside][-1]
            expected_last = kept[-1]
            assert (last is None) if np.isnan(expected_last) else last == expected_last
        # buckets tile the range's points
        assert (
            sum(b.metrics["loss"][0] for b in buckets)
            == np.isfinite(values[(steps >= low) & (steps <= high)]).sum()
        )


def test_missing_sources_are_named_when_the_names_tell_them():
    assert store_jobs.missing_sources(["host-0", "host-2"], 4) == ["host-1", "host-3"]
    assert store_jobs.missing_sources(["0"], 2) == ["1"]
    assert store_jobs.missing_sources(["a", "b"], 3) is None
    assert store_jobs.missing_sources(["h-0", "g-1"], 3) is None
    assert sorted(["host-10", "host-2"], key=store_jobs.source_order) == ["host-2", "host-10"]


@pytest.mark.parametrize(
    ("received", "sources"),
    [
        (["h0", "h00"], 3),  # both read as index 0: two names, one index
        (["h00"], 3),
        (["h1", "h01", "h001"], 5),
        (["host-07"], 8),
        (["0", "00"], 3),
        (["h3"], 3),  # an index not below sources
    ],
    ids=["h0-h00", "h00", "h1-h01-h001", "leading-zero", "0-00", "out-of-range"],
)
def test_missing_sources_are_unknown_when_names_are_not_canonical(received, sources):
    assert store_jobs.missing_sources(received, sources) is None


def test_missing_sources_always_count_what_is_missing():
    rng = np.random.default_rng(3)
    for _ in range(500):
        sources = int(rng.integers(1, 12))
        names = [f"h{int(i)}" for i in rng.integers(0, 12, size=int(rng.integers(1, 6)))]
        names += [f"h0{int(i)}" for i in rng.integers(0, 3, size=int(rng.integers(0, 2)))]
        received = list(dict.fromkeys(names))  # distinct, as stored
        missing = store_jobs.missing_sources(received, sources)
        if missing is not None:
            assert len(missing) == sources - len(received), (received, sources, missing)
            assert not set(missing) & set(received)


@pytest.mark.parametrize(
    "steps",
    [[0], [4095], [0, 1, 2, 4095], list(range(2047)), list(range(2048)), list(range(4096))],
    ids=["first", "last", "edges", "sparse-most", "dense-least", "full"],
)
def test_coverage_blocks_round_trip_and_are_stored_sparse_when_smaller(steps):
    counts = np.zeros(4096, dtype="<u2")
    counts[steps] = np.arange(1, len(steps) + 1) % 65535 + 1
    blob = store_parts.encode_coverage(counts)
    assert np.array_equal(store_parts.decode_coverage(blob), counts)
    assert len(blob) == min(4 * len(steps), 8192) if len(steps) < 2048 else len(blob) == 8192
    # A dense block written before the sparse encoding reads unchanged.
    assert np.array_equal(store_parts.decode_coverage(counts.tobytes()), counts)


def test_a_history_page_stops_within_its_byte_budget(store):
    texts = [json.dumps({"v": [k + 10] * 100}) for k in range(50)]  # all one length
    store._write(
        lambda c: store_jobs.push(
            c, "bytes", [_point(s, t) for s, t in enumerate(texts)], "t0", None
        )
    )
    size = len(texts[0]) + store_jobs.POINT_OVERHEAD
    budget = size * 7 + 5
    entries, more = store._run(
        lambda c: store_jobs.history_page(c, "bytes", 0, 10**9, 1000, False, budget)
    )
    assert [e.step for e in entries] == list(range(7)) and more is True
    whole, more = store._run(lambda c: store_jobs.history_page(c, "bytes", 0, 10**9, 1000, False))
    assert len(whole) == 50 and more is False
    one, more = store._run(  # a point larger than the budget alone is still read
        lambda c: store_jobs.history_page(c, "bytes", 0, 10**9, 1000, False, 10)
    )
    assert [e.step for e in one] == [0] and more is True


def _point(step: int, reduced: str) -> store_jobs.PushItem:
    return store_jobs.PushItem(
        step=step, source="", sources=1, digest=reduced, num_devices=1, reduced=reduced
    )


def test_grouped_writes_share_one_commit_and_a_failing_one_is_rolled_back_alone(store):
    import threading

    from app.core.errors import StepConflict

    store._write(lambda c: store_jobs.push(c, "g", [_point(0, '{"a":0}')], "t0", None))
    commits = []
    store._conn.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)
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

    with store._lock:  # every write queues behind this: one group takes them all
        threads = [threading.Thread(target=push, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        while len(store._group) < 8:
            threading.Event().wait(0.001)
    for thread in threads:
        thread.join()
    store._conn.set_trace_callback(None)
    assert commits == ["COMMIT"]
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
    from app.services import jobs
    from app.storage.part_blobs import encode_part

    def part(source, loss):
        point = jobs.PointInput(7, {"loss": np.array(loss)}, {}, None, "propagate", source, 3)
        return jobs.build_items([point])

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
        store._write(lambda c: store_jobs.push(c, "old", retry, "t1", jobs._merge_rows))
        assert retry[0].created is False and retry[0].complete is False
        assert retry[0].missing == ["host-2"]
        changed = part("host-1", [3.0, 5.0])
        with pytest.raises(Exception, match="stored with other content"):
            store._write(lambda c: store_jobs.push(c, "old", changed, "t1", jobs._merge_rows))
        last = part("host-2", [5.0, 6.0])
        store._write(lambda c: store_jobs.push(c, "old", last, "t2", jobs._merge_rows))
        assert last[0].complete and json.loads(last[0].step_reduced) == {"loss": 3.5}
        late = part("host-3", [5.0, 6.0])
        with pytest.raises(Exception, match="already has all 3 sources"):
            store._write(lambda c: store_jobs.push(c, "old", late, "t3", jobs._merge_rows))
        open_parts = store._run(
            lambda c: c.execute(
                "SELECT COUNT(*) FROM job_segments WHERE pending > 0 OR arrays IS NOT NULL"
            ).fetchone()
        )
        assert open_parts == (0,)
    finally:
        store.close()


def test_a_step_stored_with_an_older_digest_is_compared_by_its_values(store):
    from app.services import jobs

    def point(loss):
        return jobs.build_items(
            [jobs.PointInput(3, {"loss": np.array(loss)}, {}, None, "propagate")]
        )

    first = point([1.0, 3.0])
    first[0].digest = "0" * 32  # a blake2b digest, as stored before 2026-12-01
    store._write(lambda c: store_jobs.push(c, "old-digest", first, "t0", jobs._merge_rows))
    retry = point([1.0, 3.0])
    assert retry[0].digest.startswith("r") and len(retry[0].digest) == 17
    store._write(lambda c: store_jobs.push(c, "old-digest", retry, "t1", jobs._merge_rows))
    assert retry[0].created is False and retry[0].complete
    with pytest.raises(Exception, match="stored with other content"):
        other = point([1.0, 5.0])
        store._write(lambda c: store_jobs.push(c, "old-digest", other, "t2", jobs._merge_rows))


def test_the_jobs_list_finds_a_straggling_step_without_reading_the_complete_ones(store):
    from app.services import jobs

    def parts(source, steps):
        points = [
            jobs.PointInput(
                s, {"loss": np.array([float(s), 1.0])}, {}, None, "propagate", source, 2
            )
            for s in steps
        ]
        return jobs.build_items(points)

    every = list(range(0, 300))
    store._write(
        lambda c: store_jobs.push(c, "late", parts("host-0", every), "t0", jobs._merge_rows)
    )
    behind = [s for s in every if s != 5]
    store._write(
        lambda c: store_jobs.push(c, "late", parts("host-1", behind), "t1", jobs._merge_rows)
    )
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    try:
        job = store._run(lambda c: store_jobs.get_job(c, "late"))
    finally:
        store._conn.set_trace_callback(None)
    assert (job.incomplete_step, job.received_sources, job.points) == (5, ["host-0"], 299)
    # The 299 complete steps between are not read to find it.
    assert not [s for s in statements if "job_points" in s], statements


def test_a_push_holding_a_step_whole_and_as_a_part_is_refused(store):
    from app.core.errors import SourcesMismatch
    from app.services import jobs

    whole = jobs.PointInput(9, {"loss": np.array([1.0, 2.0])}, {}, None, "propagate")
    part = jobs.PointInput(9, {"loss": np.array([3.0])}, {}, None, "propagate", "host-0", 2)
    items = jobs.build_items([whole, part])
    with pytest.raises(SourcesMismatch):
        store._write(lambda c: store_jobs.push(c, "mixed", items, "t0", jobs._merge_rows))
    assert store._run(lambda c: store_jobs.get_job(c, "mixed")) is None  # nothing stored
