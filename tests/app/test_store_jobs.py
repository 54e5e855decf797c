"""The job tables: rollup segments, downsampled reads against a brute-force answer."""

from __future__ import annotations

import json
import math

import anyio
import numpy as np
import pytest

from app import store_jobs
from app.store import Store


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
