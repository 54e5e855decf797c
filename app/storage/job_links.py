"""The ``job_links`` table: the plan a job runs and the metric that holds its measured
step time (DESIGN v1.3, "Calibrations"), and the measured steps the job's fidelity is
worked out from.

A link is one row per job, replaced by a later link, removed by :func:`unlink_job`
(whether or not its plan is still stored); deleting the job deletes it
(:func:`app.storage.jobs.delete_job`). Reading the measured steps is bounded:
:data:`MEASURED_STEPS` of the newest points at most.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from app.storage.store import Connection, Statement, Store

MEASURED_STEPS = 10_000
"""The newest points whose step-time metric a fidelity reads, at most (about 1 MB of
reduced text for a dozen metrics a point)."""


@dataclass(frozen=True)
class JobLink:
    job: str
    plan: str
    step_time_metric: str
    linked_at: str


def _link(conn: Connection, job: str) -> JobLink | None:
    row = conn.execute(
        Statement(
            "SELECT job, plan, step_time_metric, linked_at FROM job_links WHERE job = ?",
            "SELECT job, plan, step_time_metric, linked_at FROM job_links WHERE job = %s",
        ),
        (job,),
    ).fetchone()
    return None if row is None else JobLink(*row)


def _write(conn: Connection, link: JobLink) -> bool:
    if (
        conn.execute(
            Statement(
                "SELECT 1 FROM jobs WHERE job = ?",
                "SELECT 1 FROM jobs WHERE job = %s",
            ),
            (link.job,),
        ).fetchone()
        is None
    ):
        return False
    conn.execute(
        Statement(
            "INSERT INTO job_links (job, plan, step_time_metric, linked_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (job) DO UPDATE SET plan = excluded.plan, "
            "step_time_metric = excluded.step_time_metric, linked_at = excluded.linked_at",
            "INSERT INTO job_links (job, plan, step_time_metric, linked_at) VALUES (%s, %s, %s, "
            "%s) "
            "ON CONFLICT (job) DO UPDATE SET plan = excluded.plan, "
            "step_time_metric = excluded.step_time_metric, linked_at = excluded.linked_at",
        ),
        (link.job, link.plan, link.step_time_metric, link.linked_at),
    )
    return True


MIN_STEP_S = 1e-9
MAX_STEP_S = 1e7
"""A pushed step time outside [``MIN_STEP_S``, ``MAX_STEP_S``] seconds (a nanosecond to
116 days; zero, negative, subnormal or absurdly large) cannot be a training step's and is
left out of every measurement (fidelity's median, jobs calibrations), so no median, ratio
or fit is built on it."""


def _measured(conn: Connection, job: str, metric: str, limit: int) -> list[float]:
    rows = conn.execute(
        Statement(
            "SELECT reduced FROM job_points WHERE job = ? ORDER BY step DESC LIMIT ?",
            "SELECT reduced FROM job_points WHERE job = %s ORDER BY step DESC LIMIT %s",
        ),
        (job, limit),
    ).fetchall()
    out = []
    for (text,) in rows:
        value = orjson.loads(text).get(metric)
        if isinstance(value, int | float) and not isinstance(value, bool):
            if MIN_STEP_S <= value <= MAX_STEP_S:
                out.append(float(value))
    return out


async def link_job(store: Store, link: JobLink) -> bool:
    """Links the job to its plan (replacing an earlier link); False when there is no
    such job."""
    return await store.write(lambda c: _write(c, link))


def _unlink(conn: Connection, job: str) -> bool | None:
    removed = conn.execute(
        Statement("DELETE FROM job_links WHERE job = ?", "DELETE FROM job_links WHERE job = %s"),
        (job,),
    ).rowcount
    if removed:
        return True
    found = conn.execute(
        Statement("SELECT 1 FROM jobs WHERE job = ?", "SELECT 1 FROM jobs WHERE job = %s"), (job,)
    ).fetchone()
    return None if found is None else False


async def unlink_job(store: Store, job: str) -> bool | None:
    """Removes the job's link to its plan (stored or deleted since): True when it had one,
    False when it had none, None when there is no such job. Works on a full disk."""
    return await store.delete(lambda c: _unlink(c, job))


async def read_link(store: Store, job: str) -> JobLink | None:
    return await store.read(lambda c: _link(c, job))


async def read_links(store: Store, jobs: list[str]) -> dict[str, JobLink]:
    """The links of ``jobs`` (a page of the jobs list), by job."""

    def run(conn: Connection) -> dict[str, JobLink]:
        found = (_link(conn, job) for job in jobs)
        return {link.job: link for link in found if link is not None}

    return await store.read(run)


async def measured_steps(
    store: Store, job: str, metric: str, limit: int = MEASURED_STEPS
) -> list[float]:
    """The metric's values over the job's newest ``limit`` points (at most
    :data:`MEASURED_STEPS`; points without it, with a non-finite value stored as null, or
    with a value no step can take (:data:`MAX_STEP_S`) are left out)."""
    return await store.read(lambda c: _measured(c, job, metric, min(limit, MEASURED_STEPS)))
