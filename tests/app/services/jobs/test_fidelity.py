"""A job's fidelity (app.services.jobs.fidelity): the plan's predicted step against the
median of the measured ones, and what it answers when the plan is gone or nothing was
measured yet."""

from __future__ import annotations

import anyio
import orjson
import pytest

from app.core.errors import InvalidRequest, JobNotFound, MeshNotFound
from app.services.jobs import fidelity
from app.storage import job_links
from app.storage import jobs as store_jobs
from app.storage import plans as stored_plans
from datarax.answers.jobs import JobFidelity


def _plan(store, plan_id, step_s):
    body = {"id": plan_id, "step_estimate": {"step_s": step_s}} if step_s else {"id": plan_id}
    anyio.run(stored_plans.insert_plan, store, plan_id, "2026-12-06T00:00:00Z", None, False,
              orjson.dumps(body).decode())  # fmt: skip


def _points(store, job, values):
    items = [
        store_jobs.PushItem(step=i, source="", sources=1, digest=str(v), num_devices=1,
                            reduced=orjson.dumps({"step_time": v}).decode())
        for i, v in enumerate(values)
    ]  # fmt: skip
    anyio.run(store_jobs.store_points, store, job, items)


def test_the_median_of_the_measured_steps_against_the_plan(store):
    _plan(store, "p", 2.5)
    _points(store, "j", [40.0, 2.0, 3.0, 2.0])  # the first step's compile is an outlier
    anyio.run(fidelity.link, store, "j", "p", None)
    link = anyio.run(job_links.read_link, store, "j")
    out = anyio.run(fidelity.fidelity, store, link)
    assert isinstance(out, JobFidelity)
    assert out == {"plan": "p", "step_time_metric": "step_time", "predicted_step_s": 2.5,
                   "measured_step_s": 2.5, "error": 0.0, "points": 4}  # fmt: skip
    # the plan deleted: nothing to compare with, the measurement stays
    anyio.run(stored_plans.delete_plan, store, "p")
    gone = anyio.run(fidelity.fidelity, store, link)
    assert gone["predicted_step_s"] is None and gone["error"] is None
    assert gone["measured_step_s"] == 2.5
    # measured nothing yet under that metric
    other = job_links.JobLink("j", "p", "absent", "x")
    assert anyio.run(fidelity.fidelity, store, other)["measured_step_s"] is None


def test_step_times_that_cannot_be_real_are_not_measured(store):
    # Issue 58, class 8: -1 entered the median; zero, subnormal and absurd values divide
    # or overflow downstream. Each is left out; the real steps alone are measured.
    _plan(store, "p", 4.0)
    _points(store, "j", [-1.0, 0.0, 1e-320, 1e300, 2.0, 2.0, 2.0])
    anyio.run(fidelity.link, store, "j", "p", None)
    link = anyio.run(job_links.read_link, store, "j")
    out = anyio.run(fidelity.fidelity, store, link)
    assert out.measured_step_s == 2.0 and out.points == 3 and out.error == 1.0
    _points(store, "k", [-1.0, 0.0])  # nothing real: nothing measured, no error
    anyio.run(fidelity.link, store, "k", "p", None)
    none = anyio.run(fidelity.fidelity, store, anyio.run(job_links.read_link, store, "k"))
    assert none.measured_step_s is None and none.error is None and none.points == 0


def test_links_need_a_job_and_a_plan_with_an_estimate(store):
    _plan(store, "bare", None)
    _plan(store, "p", 1.0)
    _points(store, "j", [1.0])
    with pytest.raises(MeshNotFound):
        anyio.run(fidelity.link, store, "j", "nope", None)
    with pytest.raises(InvalidRequest):
        anyio.run(fidelity.link, store, "j", "bare", None)
    with pytest.raises(JobNotFound):
        anyio.run(fidelity.link, store, "nobody", "p", None)
