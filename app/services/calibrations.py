"""Calibration profiles (DESIGN v1.3, "Calibrations"): the published ones the library
ships and the ones fitted here on the measured steps of jobs linked to their plans.

``POST /v1/calibrations {"kind": "jobs", "jobs": [...]}`` re-prices each job's plan into
the step model's uncalibrated parts (the plan's hardware, mesh, model, batch, optimizer
and options, as the plan stored them), takes the median of the job's measured steps
(:mod:`app.services.jobs.fidelity`; only times a step can take,
:data:`app.storage.job_links.MIN_STEP_S` to :data:`~app.storage.job_links.MAX_STEP_S`),
fits the constants on those pairs by the grid search the published profiles come from
(:func:`datarax.estimate.calibrations.fit_jobs`) and stores the profile. A plan or a
recommendation then names it as ``calibration``.

The fit is heavy work: its cells (:func:`~datarax.estimate.calibrations.fit_work`: jobs x
grid points, and as many again for the leave-one-out refits) are counted first and
refused past ``DATARAX_MAX_CALIBRATION_CELLS`` (422 ``calibration_too_large``); the
re-pricing and the fit then run in the heavy lane (:mod:`app.services.heavy_work`), off
the event loop, abandoned when the client leaves. The profile is stored only once the fit
and its answer's JSON are whole (nothing is stored on an error), with the retention of
``DATARAX_CALIBRATIONS_KEEP`` in the same transaction (:mod:`app.storage.calibrations`).
"""

from __future__ import annotations

import statistics
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import orjson

from app.core.errors import (
    CalibrationRunning,
    InvalidRequest,
    JobNotFound,
    JobNotLinked,
    NoMeasuredSteps,
    ServiceError,
    from_library,
)
from app.services.heavy_work import HeavyWork
from app.storage import calibrations as stored
from app.storage import history as store_history
from app.storage import job_links
from app.storage import plans as stored_plans
from app.storage.store import Store
from datarax.answers.calibrations import CalibrationProfile, CalibrationStack, JobsFitError
from datarax.errors import PlanError
from datarax.estimate.calibrations import (
    GRID_POINTS,
    default_constants,
    fit_jobs,
    fit_work,
    is_published,
    published_profiles,
)
from datarax.estimate.cost import estimate_step
from datarax.estimate.serving_profiles import is_serving_profile, serving_profiles
from datarax.hardware.chips import HARDWARE, get_hardware
from datarax.hardware.topology import plan_hardware_devices
from datarax.names import did_you_mean
from datarax.parallel.options import ParallelOptions
from datarax.plan.layout import PlanCancelled

MAX_JOBS = 256
"""Jobs one fit takes at most (the request schema's bound)."""


_SHIPPED = {p.id: p for p in [*published_profiles(), *serving_profiles()]}
"""The profiles the library ships: the training ones, then the serving engines' (DESIGN
v1.4: ``published-<kind>-<engine>``)."""

_PUBLISHED_JSON = [orjson.dumps(p.to_json()) for p in _SHIPPED.values()]
"""The shipped profiles' JSON (:class:`CalibrationProfile`), encoded once: they never
change."""


async def list_profiles(store: Store, limit: int = 100, offset: int = 0) -> bytes:
    """The JSON of :class:`~datarax.answers.calibrations.CalibrationList`: a page of the
    published profiles, then the stored ones, newest first, as they were stored, and
    ``total``, how many both hold."""
    published = _PUBLISHED_JSON[offset : offset + limit]
    texts, stored_total = await stored.page_profiles(
        store, limit - len(published), max(0, offset - len(_PUBLISHED_JSON))
    )
    items = published + [t.encode() for t in texts]
    total = len(_PUBLISHED_JSON) + stored_total
    return b'{"items":[' + b",".join(items) + b'],"total":' + str(total).encode() + b"}"


async def read_profile(store: Store, profile_id: str) -> bytes:
    """One profile's JSON (:class:`CalibrationProfile`): a published one's, or a stored
    one as it was stored. Raises ServiceError: 404 ``calibration_not_found``."""
    if profile_id in _SHIPPED:
        return orjson.dumps(_SHIPPED[profile_id].to_json())
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
    if is_serving_profile(profile_id):
        raise ServiceError(
            f"calibration {profile_id!r} prices serving (an inference engine's prefill and "
            "decode), not a training step: name a training profile (GET /v1/calibrations, "
            "stack.framework jax or pytorch), or leave calibration out",
            code="invalid_calibration",
        )
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


def _plan_parts(plan: dict[str, Any]) -> dict[str, float]:
    """The step model's uncalibrated parts of a stored plan.

    Raises:
      PlanError: the library's, for a plan it cannot price.
    """
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
    return dict(estimate.predicted_components)


async def _job_row(store: Store, job: str) -> dict[str, Any]:
    """What the fit needs of one job, read from the store: its plan, the plan's
    accelerator kind, the median of its measured steps. Nothing heavy."""
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
        raise NoMeasuredSteps(
            f"job {job!r} pushed no {link.step_time_metric!r} a step can take yet (a time "
            f"from {job_links.MIN_STEP_S:g} s to {job_links.MAX_STEP_S:g} s)"
        )
    median = statistics.median(measured)
    if not job_links.MIN_STEP_S <= median <= job_links.MAX_STEP_S:  # the bounds hold it
        raise InvalidRequest(f"job {job!r}'s median step time {median!r} s cannot be fitted")
    plan = orjson.loads(text)
    if not isinstance(plan.get("hardware"), str):
        raise InvalidRequest(
            f"job {job!r}'s plan {link.plan!r} names no hardware, so it has no step to fit: "
            "link the job to a hardware plan"
        )
    try:
        kind = get_hardware(plan["hardware"]).kind
    except PlanError as error:
        raise from_library(error) from None
    return {
        "job": job,
        "plan": link.plan,
        "kind": kind,
        "hardware": plan["hardware"],
        "body": plan,
        "measured_step_s": median,
        "points": len(measured),
    }


def _too_large(jobs: int, max_cells: int) -> ServiceError | None:
    """422 ``calibration_too_large`` when a fit on ``jobs`` jobs passes ``max_cells``."""
    cells = fit_work(jobs)
    if cells <= max_cells:
        return None
    most = max((n for n in range(1, MAX_JOBS + 1) if fit_work(n) <= max_cells), default=0)
    return ServiceError(
        f"a fit on {jobs} jobs computes {cells:,} grid cells (each job at each of the "
        f"{GRID_POINTS:,} points of the grid, and again for the leave-one-out refits), "
        f"past this service's limit of {max_cells:,} (DATARAX_MAX_CALIBRATION_CELLS): "
        + (f"fit on at most {most} jobs at a time" if most else "raise the limit"),
        code="calibration_too_large",
        extra={"cells": cells, "limit": max_cells, "max_jobs": most},
    )


def _fit(
    rows: list[dict[str, Any]], framework: str, should_stop: Callable[[], bool]
) -> tuple[CalibrationProfile, str]:
    """The heavy part, in a worker thread: re-prices each plan once (``should_stop``
    between plans), fits, and answers the profile with its JSON text, checked whole.

    Raises:
      PlanError: the library's (a plan it cannot price; rows it cannot fit).
      PlanCancelled: ``should_stop`` answered true.
    """
    parts: dict[str, dict[str, float]] = {}
    for row in rows:
        if row["plan"] not in parts:
            if should_stop():
                raise PlanCancelled("the jobs calibration was abandoned")
            try:
                parts[row["plan"]] = _plan_parts(row["body"])
            except PlanError:
                raise
            except (KeyError, TypeError, ValueError) as error:  # a plan stored without it
                raise PlanError(
                    "invalid_request",
                    f"job {row['job']!r}'s plan {row['plan']!r} cannot be priced again "
                    f"({type(error).__name__}: {error}); link the job to a plan made by "
                    "this version (POST /v1/meshes)",
                ) from None
    pairs = [(parts[r["plan"]], r["measured_step_s"]) for r in rows]
    hardware = sorted({r["hardware"] for r in rows})
    base = default_constants(get_hardware(hardware[0]))
    fit = fit_jobs(pairs, base, should_stop)
    # to the microsecond: profiles are listed (and kept) newest first by it
    now = datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
    source = f"fitted on the measured steps of {len(rows)} job(s) linked to their plans, {now}"
    profile = CalibrationProfile(
        id=f"jobs-{uuid.uuid4().hex[:12]}",
        kind="jobs",
        hardware_kind=rows[0]["kind"],
        stack=CalibrationStack(framework=framework),
        constants=replace(fit.constants, source=source),
        error=JobsFitError(
            training_mae=fit.training_mae,
            training_runs=len(pairs),
            leave_one_out_mae=fit.leave_one_out_mae,
            published_mae=fit.published_mae,
        ),
        hardware=hardware[0] if len(hardware) == 1 else None,
        measurements=tuple(
            {k: r[k] for k in ("job", "plan", "hardware", "measured_step_s", "points")}
            for r in rows
        ),
        created_at=now,
        warnings=fit.warnings or None,
    )
    # every figure finite (fit_jobs refuses the rest): the JSON the answer and the store hold
    return profile, orjson.dumps(profile.to_json()).decode()


async def calibrate_jobs(
    store: Store,
    jobs: list[str],
    framework: str = "jax",
    *,
    lane: HeavyWork,
    client_gone: Callable[[], Awaitable[bool]] | None = None,
    max_cells: int,
    keep: int | None = None,
) -> tuple[CalibrationProfile, str]:
    """Fits, stores and answers a ``jobs`` profile on the jobs' measured steps, with its
    stored JSON text. The fit's cells are counted before anything is read; the
    re-pricing and the fit run on ``lane``; the profile is stored (with retention,
    ``keep``) only once whole.

    Raises:
      ServiceError: 422 ``calibration_too_large``; JobNotFound; JobNotLinked;
        NoMeasuredSteps; InvalidRequest (a plan gone, or plans of different accelerator
        kinds); the library's codes (``invalid_calibration`` for rows no fit can take);
        the lane's (503 ``busy``, 499 ``request_abandoned``, 503 ``shutting_down``).
    """
    names = list(dict.fromkeys(jobs))
    refused = _too_large(len(names), max_cells)
    if refused is not None:
        raise refused
    rows = [await _job_row(store, job) for job in names]
    kinds = sorted({r["kind"] for r in rows})
    if len(kinds) != 1:
        raise InvalidRequest(f"the jobs' plans are on {kinds} hardware: fit one kind at a time")
    try:
        profile, text = await lane.run(
            "jobs calibration", lambda stop: _fit(rows, framework, stop), client_gone
        )
    except PlanError as error:
        raise from_library(error) from None
    await stored.insert_profile(
        store, profile.id, profile.created_at, "jobs", kinds[0], None, text, keep=keep
    )
    return profile, text


async def delete_profile(store: Store, profile_id: str) -> None:
    """Deletes a stored profile.

    Raises:
      ServiceError: 404 ``calibration_not_found``; 409 ``calibration_published`` (a
        profile the library ships), ``calibration_running`` (a host profile measuring).
    """
    if profile_id in _SHIPPED:
        raise ServiceError(
            f"calibration {profile_id!r} ships with the library and cannot be deleted; "
            "only the profiles fitted or measured here can (kinds jobs and host)",
            code="calibration_published",
        )
    outcome = await stored.delete_profile(store, profile_id)
    if outcome == "missing":
        raise await _unknown(store, profile_id, "calibration_not_found")
    if outcome == "running":
        raise CalibrationRunning(
            f"host calibration {profile_id!r} is measuring the devices; delete it once its "
            f"status is done or failed (GET /v1/calibrations/{profile_id})"
        )


__all__ = [
    "MAX_JOBS",
    "calibrate_jobs",
    "delete_profile",
    "list_profiles",
    "read_profile",
    "resolve",
]
