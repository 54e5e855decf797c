"""Jobs that report back to their plans (DESIGN v1.3, "Calibrations"): a job linked to a
stored plan answers ``fidelity``, the plan's predicted step time against the median of the
job's measured ones.

The measured step is a metric the job pushes (``step_time_metric``, seconds a step;
default ``step_time``); the median over the newest points
(:data:`app.storage.job_links.MEASURED_STEPS` at most, :data:`LIST_MEASURED_STEPS` in the
jobs list) is robust to the first steps' compiles and to stragglers.
"""

from __future__ import annotations

import statistics
from datetime import UTC, datetime

import orjson

from app.core.errors import InvalidRequest, JobNotFound, MeshNotFound
from app.storage import job_links
from app.storage import plans as stored_plans
from app.storage.store import Store
from datarax.answers.jobs import JobFidelity

DEFAULT_METRIC = "step_time"
LIST_MEASURED_STEPS = 1_000
"""Points a job's fidelity reads in ``GET /v1/jobs`` (a page of up to 100 jobs)."""


def _predicted(summary_text: str | None) -> float | None:
    if summary_text is None:
        return None
    step = orjson.loads(summary_text).get("step_estimate") or {}
    value = step.get("step_s")
    return float(value) if isinstance(value, int | float) else None


async def link(store: Store, job: str, plan: str, metric: str | None) -> None:
    """Links ``job`` to the stored ``plan``; its step time is the pushed ``metric``.

    Raises:
      JobNotFound: no such job. MeshNotFound: no such plan. InvalidRequest: a plan with
      no step estimate (planned without a model and batch).
    """
    summary = await stored_plans.get_plan_summary(store, plan)
    if summary is None:
        raise MeshNotFound(f"no mesh plan with id {plan!r} to link the job to; list plans at "
                           "/v1/meshes")  # fmt: skip
    if _predicted(summary) is None:
        raise InvalidRequest(
            f"plan {plan!r} has no step_estimate to compare the job with: plan it with "
            "hardware, a model and batch_shape"
        )
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    found = await job_links.link_job(
        store, job_links.JobLink(job, plan, metric or DEFAULT_METRIC, now)
    )
    if not found:
        raise JobNotFound(f"no job named {job!r}; GET /v1/jobs lists them")


async def fidelity(
    store: Store, link: job_links.JobLink, limit: int = job_links.MEASURED_STEPS
) -> JobFidelity:
    """The linked job's plan against its measured steps: ``error`` is ``predicted /
    measured - 1`` (positive: the plan predicted a slower step than the job ran); ``None``
    members where the plan is gone or no step was measured yet."""
    predicted = _predicted(await stored_plans.get_plan_summary(store, link.plan))
    measured = await job_links.measured_steps(store, link.job, link.step_time_metric, limit)
    median = statistics.median(measured) if measured else None
    error = predicted / median - 1 if predicted is not None and median else None
    return JobFidelity(
        plan=link.plan,
        step_time_metric=link.step_time_metric,
        predicted_step_s=predicted,
        measured_step_s=median,
        error=error,
        points=len(measured),
    )
