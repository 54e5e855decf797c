"""The jobs list, finishing and deleting a job, and the gauges of stale and lagging jobs."""

from __future__ import annotations

from datetime import UTC, datetime

import anyio
import numpy as np
import orjson
import pytest

from app.core.errors import JobNotFound
from app.services.jobs.decode import JobBatch, PointInput
from app.services.jobs.push import push_single
from app.services.jobs.summaries import (
    delete_job,
    get_job,
    job_gauges,
    list_jobs,
    seconds_since,
    update_job,
)
from datarax.answers.jobs import JobList, JobSummary


def _push(store, job, step, source="", sources=1) -> None:
    point = PointInput(step, {"x": np.array([1.0])}, {}, None, "propagate", source, sources)
    anyio.run(push_single, store, job, JobBatch(points=[point], single=True))


def test_a_job_is_listed_finished_and_deleted(store):
    _push(store, "a", 1)
    _push(store, "b", 0, "h0", 3)
    listed = anyio.run(list_jobs, store, 10, 0)
    assert isinstance(listed, JobList) and listed.total == 2
    assert {item.job for item in listed.items} == {"a", "b"}
    b = anyio.run(get_job, store, "b")
    assert isinstance(b, JobSummary)
    assert (b.incomplete_step, b.lagging_sources, b.missing_count) == (0, ["h1", "h2"], 2)
    assert orjson.loads(orjson.dumps(b.to_json()))["lagging_sources"] == ["h1", "h2"]
    finished = anyio.run(lambda: update_job(store, "a", finished=True))
    assert finished.finished is True and finished["finished"] is True
    anyio.run(delete_job, store, "a")
    for call in (get_job, delete_job):
        with pytest.raises(JobNotFound):
            anyio.run(call, store, "a")
    with pytest.raises(JobNotFound):
        anyio.run(lambda: update_job(store, "a", finished=False))


def test_gauges_show_stale_jobs_and_missing_sources(store):
    _push(store, "a", 1)
    _push(store, "b", 0, "h0", 3)
    seconds, stragglers = anyio.run(job_gauges, store, 1)
    assert len(seconds) == 2 and "<other>" in seconds
    assert stragglers == {"b": 2.0}


def test_seconds_since_is_never_negative():
    now = datetime(2026, 12, 1, 0, 0, 10, tzinfo=UTC)
    assert seconds_since("2026-12-01T00:00:00Z", now) == 10.0
    assert seconds_since("2026-12-02T00:00:00Z", now) == 0.0
