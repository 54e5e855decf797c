"""Calibration profiles (DESIGN v1.3, "Calibrations"): the published ones the library
ships and the ones fitted here on the measured steps of jobs linked to their plans.

``POST /v1/calibrations {"kind": "jobs", "jobs": [...]}`` re-prices each job's plan into
the step model's uncalibrated parts (the plan's hardware, mesh, model, batch, optimizer
and options, as the plan stored them), takes the median of the job's measured steps
(:mod:`app.services.jobs.fidelity`), fits the constants on those pairs by the grid search
the published profiles come from (:func:`datarax.estimate.calibrations.fit_constants`) and
stores the profile. A plan or a recommendation then names it as ``calibration``.
"""

from __future__ import annotations

import statistics
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import anyio.to_thread
import orjson

from app.core.errors import (
    InvalidRequest,
    JobNotFound,
    JobNotLinked,
    NoMeasuredSteps,
    ServiceError,
    from_library,
)
from app.storage import calibrations as stored
from app.storage import history as store_history
from app.storage import job_links
from app.storage import plans as stored_plans
from app.storage.store import Store
from datarax.answers.calibrations import CalibrationProfile, CalibrationStack, JobsFitError
from datarax.errors import PlanError
from datarax.estimate.calibrations import (
    default_constants,
    fit_constants,
    get_profile,
    is_published,
    leave_one_out,
    mean_error,
    published_profiles,
)
from datarax.estimate.cost import estimate_step
from datarax.hardware.chips import HARDWARE, get_hardware
from datarax.hardware.topology import plan_hardware_devices
from datarax.names import did_you_mean
from datarax.parallel.options import ParallelOptions

MAX_JOBS = 256
"""Jobs one fit takes at most (each re-prices its plan: ~1 s for a 65,536-chip one)."""


_PUBLISHED_JSON = [orjson.dumps(p.to_json()) for p in published_profiles()]
"""The published profiles' JSON (:class:`CalibrationProfile`), encoded once: they never
change."""


async def list_profiles(store: Store) -> bytes:
    """The JSON of :class:`~datarax.answers.calibrations.CalibrationList`: the published
    profiles, then the stored ones, newest first, as they were stored."""
    texts = await stored.list_profiles(store)
    items = _PUBLISHED_JSON + [t.encode() for t in texts]
    return b'{"items":[' + b",".join(items) + b"]}"


async def read_profile(store: Store, profile_id: str) -> bytes:
    """One profile's JSON (:class:`CalibrationProfile`): a published one's, or a stored
    one as it was stored. Raises ServiceError: 404 ``calibration_not_found``."""
    if is_published(profile_id):
        return orjson.dumps(get_profile(profile_id).to_json())
    text = await stored.get_profile(store, profile_id)
    if text is None:
        raise await _unknown(store, profile_id, "calibration_not_found")
    return text.encode()


async def resolve(
    store: Store, profile_id: str | None, hardware: str | None = None
) -> str | CalibrationProfile | None:
    """A request's ``calibration`` as the library takes it: a published id as is, a
    stored profile read back. Without one, the newest ``host`` profile that finished on
    devices of ``hardware``'s ``device_kind`` (the contract's default), else ``None``
    (the library's default, the kind's published ``jax`` profile).

    Raises:
      ServiceError: 422 ``unknown_calibration``; ``invalid_calibration`` for a host
        profile still measuring or failed.
    """
    if profile_id is None:
        return await _host_default(store, hardware)
    if is_published(profile_id):
        return profile_id
    text = await stored.get_profile(store, profile_id)
    if text is None:
        raise await _unknown(store, profile_id)
    body = orjson.loads(text)
    if body.get("status", "done") != "done":
        raise ServiceError(
            f"calibration {profile_id!r} is {body['status']}, so it has no constants yet"
            + ("" if body["status"] == "running" else ": run the host calibration again"),
            code="invalid_calibration",
        )
    return CalibrationProfile.from_json(body)


UNKNOWN_LISTS = 20
"""Stored profile ids an ``unknown_calibration`` detail names at most (the newest)."""


async def _unknown(
    store: Store, profile_id: str, code: str = "unknown_calibration"
) -> ServiceError:
    """``unknown_calibration`` (or ``code``) naming the nearest id among the published
    profiles and the newest stored ones, and both lists (the stored one cut at
    :data:`UNKNOWN_LISTS`)."""
    rows = await stored.list_profiles(store, limit=UNKNOWN_LISTS)
    saved = [orjson.loads(row)["id"] for row in rows]
    published = [p.id for p in published_profiles()]
    hint = did_you_mean(profile_id, [*published, *saved])
    listed = f"the stored ones include {saved}" if saved else "none is stored yet"
    return ServiceError(
        f"calibration {profile_id!r} is no profile{hint}; the published profiles are "
        f"{published}, {listed} (GET /v1/calibrations lists them all)",
        code=code,
    )


async def _host_default(store: Store, hardware: str | None) -> CalibrationProfile | None:
    if hardware is None or hardware not in HARDWARE:
        return None
    device_kind = HARDWARE[hardware].device_kind
    if device_kind is None:
        return None
    text = await stored.newest_host_profile(store, device_kind)
    return None if text is None else CalibrationProfile.from_json(orjson.loads(text))


def _plan_parts(plan: dict[str, Any]) -> tuple[str, dict[str, float]]:
    """``(hardware kind, the step model's uncalibrated parts)`` of a stored plan."""
    hw = get_hardware(plan["hardware"])
    tpu = hw.kind == "tpu"  # a TPU plan's hosts, a GPU plan's slice, follow from the rest
    layout = plan_hardware_devices(
        hw,
        ici=plan["ici"],
        dcn=plan.get("dcn"),
        topology=plan.get("topology") if tpu else None,
        slices=int(plan.get("slices") or 1) if tpu else 1,
        hosts=None if tpu else plan.get("hosts"),
        allow_split_physical_axes=True,
    )
    memory = plan.get("memory_per_device") or {}
    options = ParallelOptions.from_json(
        pipeline=plan.get("pipeline"),
        context_parallel=plan.get("context_parallel"),
        shard_over_data=bool(plan.get("shard_over_data")),
    )
    estimate = estimate_step(
        hw,
        layout.axes_detail,
        plan["model"],
        int(plan["batch"]["shape"][0]),
        # the stored plan keeps its optimizer's bytes, not its name: SGD keeps none
        optimizer="adam" if memory.get("optimizer") else "sgd",
        options=options,
    )
    return hw.kind, dict(estimate.predicted_components)


async def _job_row(store: Store, job: str) -> dict[str, Any]:
    if await store_history.read_job(store, job) is None:
        raise JobNotFound(f"no job named {job!r}; GET /v1/jobs lists them")
    link = await job_links.read_link(store, job)
    if link is None:
        raise JobNotLinked(f"job {job!r} is linked to no plan: PATCH /v1/jobs/{job} with plan")
    text = await stored_plans.get_plan_summary(store, link.plan)
    if text is None:
        raise InvalidRequest(f"job {job!r}'s plan {link.plan!r} is gone")
    measured = await job_links.measured_steps(store, job, link.step_time_metric)
    if not measured:
        raise NoMeasuredSteps(f"job {job!r} pushed no {link.step_time_metric!r} yet")
    plan = orjson.loads(text)
    try:
        kind, parts = await anyio.to_thread.run_sync(lambda: _plan_parts(plan))
    except PlanError as error:
        raise from_library(error) from None
    return {
        "job": job,
        "plan": link.plan,
        "kind": kind,
        "hardware": plan["hardware"],
        "parts": parts,
        "measured_step_s": statistics.median(measured),
        "points": len(measured),
    }


async def calibrate_jobs(
    store: Store, jobs: list[str], framework: str = "jax"
) -> CalibrationProfile:
    """Fits, stores and answers a ``jobs`` profile on the jobs' measured steps.

    Raises:
      JobNotFound; JobNotLinked; NoMeasuredSteps; InvalidRequest (a plan gone, or plans
      of different accelerator kinds).
    """
    rows = [await _job_row(store, job) for job in dict.fromkeys(jobs)]
    kinds = sorted({r["kind"] for r in rows})
    if len(kinds) != 1:
        raise InvalidRequest(f"the jobs' plans are on {kinds} hardware: fit one kind at a time")
    hardware = sorted({r["hardware"] for r in rows})
    base = default_constants(get_hardware(hardware[0]))
    pairs = [(r["parts"], r["measured_step_s"]) for r in rows]
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    profile_id = f"jobs-{uuid.uuid4().hex[:12]}"
    source = f"fitted on the measured steps of {len(rows)} job(s) linked to their plans, {now}"
    constants = replace(fit_constants(pairs, base), source=source)
    profile = CalibrationProfile(
        id=profile_id,
        kind="jobs",
        hardware_kind=kinds[0],
        stack=CalibrationStack(framework=framework),
        constants=constants,
        error=JobsFitError(
            training_mae=mean_error(pairs, constants),
            training_runs=len(pairs),
            leave_one_out_mae=leave_one_out(pairs, base),
            published_mae=mean_error(pairs, base),
        ),
        hardware=hardware[0] if len(hardware) == 1 else None,
        measurements=tuple(
            {k: r[k] for k in ("job", "plan", "hardware", "measured_step_s", "points")}
            for r in rows
        ),
        created_at=now,
    )
    await stored.insert_profile(
        store, profile_id, now, "jobs", kinds[0], None, orjson.dumps(profile.to_json()).decode()
    )
    return profile


__all__ = ["MAX_JOBS", "calibrate_jobs", "list_profiles", "read_profile", "resolve"]
