"""Reads of job history: downsample segments and buckets against a brute-force answer,
pages within their byte budget, the jobs list's incomplete step."""

from __future__ import annotations

import json
import math

import anyio
import numpy as np
import pytest

from app.services.jobs.decode import PointInput
from app.services.jobs.parts import PART_RULES
from app.services.jobs.rows import build_items
from app.storage import history as store_history
from app.storage import jobs as store_jobs
from tests.app.storage.conftest import statements_sent


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


def _point(step: int, reduced: str) -> store_jobs.PushItem:
    return store_jobs.PushItem(
        step=step, source="", sources=1, digest=reduced, num_devices=1, reduced=reduced
    )


@pytest.mark.parametrize(
    ("low", "high", "top"),
    [(0, 0, 0), (3, 70000, 4), (17, 300, 1), (256, 511, 2), (5, 4100, 3)],
    ids=["one-step", "all-levels", "level-1", "aligned", "level-3"],
)
def test_segments_cover_the_range_exactly_once(low, high, top):
    covered = []
    for level, first, last in store_history._segments(low, high, top):
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


def test_a_history_page_stops_within_its_byte_budget(store):
    texts = [json.dumps({"v": [k + 10] * 100}) for k in range(50)]  # all one length
    store._write(
        lambda c: store_jobs.push(
            c, "bytes", [_point(s, t) for s, t in enumerate(texts)], "t0", None
        )
    )
    size = len(texts[0]) + store_history.POINT_OVERHEAD
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


def test_the_jobs_list_finds_a_straggling_step_without_reading_the_complete_ones(store):

    def parts(source, steps):
        points = [
            PointInput(s, {"loss": np.array([float(s), 1.0])}, {}, None, "propagate", source, 2)
            for s in steps
        ]
        return build_items(points)

    every = list(range(0, 300))
    store._write(lambda c: store_jobs.push(c, "late", parts("host-0", every), "t0", PART_RULES))
    behind = [s for s in every if s != 5]
    store._write(lambda c: store_jobs.push(c, "late", parts("host-1", behind), "t1", PART_RULES))
    with statements_sent(store) as statements:
        job = store._run(lambda c: store_jobs.get_job(c, "late"))
    assert (job.incomplete_step, job.received_sources, job.points) == (5, ["host-0"], 299)
    # The 299 complete steps between are not read to find it.
    assert statements, "no statement was recorded"
    assert not [s for s in statements if "job_points" in s], statements


def test_read_history_downsamples_only_above_max_points(store):
    steps = np.arange(0, 500)
    store._write(lambda c: store_jobs.push(c, "r", _items(steps, steps / 10), "t", None))

    def read(**options):
        return anyio.run(
            lambda: store_history.read_history(
                store, "r", 0, 10**6, limit=1000, include_partial=False, page_bytes=None, **options
            )
        )

    page = read(max_points=None)
    assert page.buckets is None and len(page.entries) == 500 and not page.more
    sized = []
    buckets = read(max_points=20, buckets_for=lambda names: sized.append(names) or 8)
    assert sized == [["loss"]] and 0 < len(buckets.buckets) <= 8 and buckets.width >= 500 / 8
    assert read(max_points=600).buckets is None  # fewer points than that: a page
    rows, total = anyio.run(store_history.read_jobs, store, 10, 0)
    assert total == 1 and rows[0].points == 500
    assert anyio.run(store_history.read_gauges, store, 5)[0] == [("r", "t")]
