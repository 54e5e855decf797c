"""The jobs list and each job's summary: its points and step range, whether it is
finished, the newest step still missing sources; and the gauges the telemetry shows."""

from __future__ import annotations

from datetime import UTC, datetime

from app.core.errors import JobLinkNotFound, JobNotFound, JobNotLinked
from app.services.jobs import fidelity as job_fidelity
from app.storage import history as store_history
from app.storage import job_links
from app.storage import jobs as store_jobs
from app.storage.parts import missing_sources
from app.storage.store import Store
from datarax.answers.jobs import JobFidelity, JobList, JobSummary


def _summary(row: store_history.JobRow, fidelity: JobFidelity | None = None) -> JobSummary:
    missing: list[str] | None = None
    count = 0
    if row.incomplete_step is not None and row.incomplete_sources:
        missing = missing_sources(row.received_sources, row.incomplete_sources)
        count = row.incomplete_sources - len(row.received_sources)
    return JobSummary(
        job=row.job,
        points=row.points,
        first_step=row.first_step,
        last_step=row.last_step,
        last_push_at=row.last_push_at,
        finished=row.finished,
        created_at=row.created_at,
        incomplete_step=row.incomplete_step,
        lagging_sources=missing,
        missing_count=count,
        fidelity=fidelity,
    )


def _not_found(job: str) -> JobNotFound:
    return JobNotFound(f"no job named {job!r}; GET /v1/jobs lists them")


async def list_jobs(store: Store, limit: int, offset: int) -> JobList:
    """The jobs, most recently pushed first, and how many there are; a job linked to a plan
    carries its ``fidelity`` over its newest
    :data:`~app.services.jobs.fidelity.LIST_MEASURED_STEPS` points."""
    rows, total = await store_history.read_jobs(store, limit, offset)
    links = await job_links.read_links(store, [r.job for r in rows])
    items = []
    for row in rows:
        found = links.get(row.job)
        measured = (
            None
            if found is None
            else await job_fidelity.fidelity(store, found, job_fidelity.LIST_MEASURED_STEPS)
        )
        items.append(_summary(row, measured))
    return JobList(items=items, total=total)


async def get_job(store: Store, job: str) -> JobSummary:
    """One job's summary (with its ``fidelity`` when it is linked to a plan); 404
    ``job_not_found``."""
    row = await store_history.read_job(store, job)
    if row is None:
        raise _not_found(job)
    found = await job_links.read_link(store, job)
    measured = None if found is None else await job_fidelity.fidelity(store, found)
    return _summary(row, measured)


async def update_job(
    store: Store,
    job: str,
    *,
    finished: bool | None = None,
    plan: str | None = None,
    step_time_metric: str | None = None,
) -> JobSummary:
    """Marks the job finished (or reopens it) and links it to a plan, as given; its
    summary after.

    Raises:
      JobNotFound; MeshNotFound (no such plan); InvalidRequest (a plan without a step
      estimate); JobNotLinked (``step_time_metric`` for a job linked to no plan).
    """
    if await store_history.read_job(store, job) is None:
        raise _not_found(job)
    if plan is not None:
        await job_fidelity.link(store, job, plan, step_time_metric)
    elif step_time_metric is not None:
        found = await job_links.read_link(store, job)
        if found is None:
            raise JobNotLinked(f"job {job!r} is linked to no plan: give plan with step_time_metric")
        await job_fidelity.link(store, job, found.plan, step_time_metric)
    if finished is not None and not await store_jobs.mark_finished(store, job, finished):
        raise _not_found(job)
    return await get_job(store, job)


async def unlink_job(store: Store, job: str) -> None:
    """Unlinks the job from its plan, whether the plan is still stored or was deleted: its
    answers then carry no ``fidelity``, and a jobs calibration leaves it out.

    Raises:
      JobNotFound: no such job. JobLinkNotFound: the job is linked to no plan.
    """
    removed = await job_links.unlink_job(store, job)
    if removed is None:
        raise _not_found(job)
    if not removed:
        raise JobLinkNotFound(
            f"job {job!r} is linked to no plan; PATCH /v1/jobs/{job} with plan links it"
        )


async def delete_job(store: Store, job: str) -> None:
    """Deletes the job's history durably; 404 ``job_not_found``."""
    if not await store_jobs.remove_job(store, job):
        raise _not_found(job)


def seconds_since(stamp: str, now: datetime) -> float:
    """Seconds from an RFC 3339 UTC ``stamp`` to ``now`` (0 for a stamp in the future)."""
    then = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    return max(0.0, (now - then).total_seconds())


async def job_gauges(store: Store, top: int) -> tuple[dict[str, float], dict[str, float]]:
    """(seconds since the last push, per job; missing sources at the newest incomplete
    step, per job), each at most ``top`` jobs plus ``"<other>"``: the stalest of the
    unlisted unfinished jobs, and the sum of the unlisted jobs' stragglers."""
    stale, pending = await store_history.read_gauges(store, top)
    now = datetime.now(UTC)
    seconds = {}
    for job, stamp in stale:
        if stamp is not None:
            seconds[job or "<other>"] = seconds_since(stamp, now)
    lagging = sorted(((sources - count, job) for job, _, sources, count in pending), reverse=True)
    stragglers = {job: float(n) for n, job in lagging[:top]}
    if len(lagging) > top:
        stragglers["<other>"] = float(sum(n for n, _ in lagging[top:]))
    return seconds, stragglers
