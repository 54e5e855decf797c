"""Retention deletes the jobs last pushed before the cutoff, and only those."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio
import numpy as np

from app.services.jobs.decode import JobBatch, PointInput
from app.services.jobs.push import push_single
from app.services.jobs.retention import expire_jobs
from app.storage import history as store_history


def test_old_jobs_are_deleted_and_recent_ones_kept(store):
    for job in ("old", "new"):
        point = PointInput(0, {"x": np.array([1.0])}, {}, None, "propagate")
        anyio.run(push_single, store, job, JobBatch(points=[point], single=True))
    store._write(
        lambda c: c.execute(
            "UPDATE jobs SET last_push_at = '2020-01-01T00:00:00Z' WHERE job = 'old'"
        )
    )
    assert anyio.run(expire_jobs, store, 0) == 0  # 0 days: retention is off
    now = datetime.now(UTC) + timedelta(seconds=1)
    assert anyio.run(expire_jobs, store, 30, now) == 1
    assert anyio.run(store_history.read_job, store, "old") is None
    assert anyio.run(store_history.read_job, store, "new") is not None


def test_old_plans_are_deleted_but_those_sessions_are_placed_on(store):
    # issue 41: plans get retention like jobs; a session keeps its plan
    from app.services.jobs.retention import expire_plans
    from app.storage import plans as store_plans
    from app.storage import sessions as store_sessions

    for plan_id, made in (
        ("m_old", "2020-01-01T00:00:00Z"),
        ("m_trained", "2020-01-01T00:00:00Z"),
        ("m_new", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")),
    ):
        anyio.run(store_plans.insert_plan, store, plan_id, made, None, False, "{}")  # fmt: skip
    anyio.run(store_sessions.insert_session, store, "s_1", "m_trained", "2020-01-01T00:00:00Z",
              '{"id": "s_1"}')  # fmt: skip
    assert anyio.run(expire_plans, store, 0) == 0  # 0 days: retention is off
    assert anyio.run(expire_plans, store, 30) == 1
    assert anyio.run(store_plans.get_plan, store, "m_old") is None
    assert anyio.run(store_plans.get_plan, store, "m_trained") == "{}"
    assert anyio.run(store_plans.get_plan, store, "m_new") == "{}"
