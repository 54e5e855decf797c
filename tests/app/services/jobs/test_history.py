"""History answers: pages continue where they stop, long ranges downsample to buckets."""

from __future__ import annotations

import anyio
import orjson
import pytest

from app.core.errors import AnswerTooLarge, InvalidParameter
from app.services.jobs.history import fitting_buckets, history
from app.services.jobs.push import push_batch
from datarax.answers.jobs import History


def _fill(store, job: str, steps: range) -> None:
    for first in range(steps.start, steps.stop, 1000):
        chunk = range(first, min(first + 1000, steps.stop))
        points = [{"step": s, "metrics": {"loss": [float(s), float(s)]}} for s in chunk]
        anyio.run(push_batch, store, job, orjson.dumps({"points": points}))


def _read(store, job: str, **options) -> dict:
    async def run() -> bytes:
        return await history(store, job, **options)

    return orjson.loads(anyio.run(run))


def test_pages_follow_each_other(store):
    _fill(store, "j", range(25))
    first = _read(store, "j", limit=10)
    assert first["kind"] == "points" and [p["step"] for p in first["points"]] == list(range(10))
    rest = _read(store, "j", after_step=first["next_after_step"], limit=100)
    assert [p["step"] for p in rest["points"]] == list(range(10, 25))
    assert rest["next_after_step"] is None and rest["points"][0]["reduced"] == {"loss": 10.0}


def test_a_long_range_is_downsampled_to_bucket_means(store):
    _fill(store, "d", range(2000))
    answer = _read(store, "d", max_points=10)
    assert answer["kind"] == "buckets" and answer["downsampled"]
    assert len(answer["points"]) <= 10
    for row, bucket in zip(answer["points"], answer["buckets"], strict=True):
        steps = range(bucket["start_step"], bucket["end_step"] + 1)
        assert row["reduced"]["loss"] == pytest.approx(sum(steps) / len(steps))
        assert bucket["metrics"]["loss"]["last"] == float(steps[-1])
    assert _read(store, "d", max_points=5000)["kind"] == "points"  # fewer points: a page


def test_a_range_upside_down_is_refused(store):
    with pytest.raises(InvalidParameter):
        _read(store, "j", since_step=5, until_step=4)


def test_buckets_are_sized_to_the_answer_limit():
    assert fitting_buckets(["loss"], 1000, 10**9) == 1000
    assert 2 <= fitting_buckets(["loss"], 1000, 10_000) < 1000
    with pytest.raises(AnswerTooLarge):
        fitting_buckets(["x" * 1000], 1000, 3000)


def _part(store, job: str, step: int, source: str) -> None:
    point = {"step": step, "metrics": {"loss": [1.0, 3.0]}, "source": source, "sources": 2}
    anyio.run(push_batch, store, job, orjson.dumps({"points": [point]}))


def test_answers_hold_exactly_the_members_of_their_class(store):
    """Pages and buckets are written from templates of the answer classes: parsed into
    :class:`History` and serialised again they are unchanged (no member missing, none
    extra, omitted members absent), spreads, partial steps and bucket rows included."""
    _fill(store, "r", range(300))
    _part(store, "r", 1000, "h-0")
    for options in ({"include_partial": True}, {"max_points": 10}, {"limit": 7}):
        answer = _read(store, "r", **options)
        assert History.from_json(answer).to_json() == answer, options
    page = _read(store, "r", include_partial=True)
    assert page["points"][0]["spread"]["loss"] == {
        "min": 0.0, "max": 0.0, "min_device": 0, "max_device": 0
    }  # fmt: skip
    partial = page["points"][-1]
    assert (partial["step"], partial["received_sources"], partial["missing_sources"]) == (
        1000, ["h-0"], ["h-1"]
    )  # fmt: skip
    buckets = _read(store, "r", max_points=10)
    row, bucket = buckets["points"][0], buckets["buckets"][0]
    assert set(row) == {"step", "reduced", "received_at", "complete", "sources", "spread",
                        "start_step", "end_step", "count"}  # fmt: skip
    assert set(bucket) == {"start_step", "end_step", "metrics", "spread"}


def test_a_partial_step_whose_missing_sources_have_no_names_says_null(store):
    _part(store, "n", 5, "a")
    (point,) = _read(store, "n", include_partial=True)["points"]
    assert "missing_sources" in point and point["missing_sources"] is None
    assert point["received_sources"] == ["a"] and point["reduced"] == {"loss": 2.0}
