"""Calibration profiles over HTTP: ``GET /v1/calibrations``, ``GET`` and ``DELETE
/v1/calibrations/{id}``, ``POST /v1/calibrations`` (DESIGN v1.3, "Calibrations").

HTTP only; the profiles are :mod:`datarax.estimate.calibrations`' (plain data, no JAX)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path, Query, Request
from starlette.responses import Response

from app.api.deps import BearerDoc, JsonBody, StoreDep
from app.api.openapi import problem_responses
from app.api.routing import JsonBodyRoute, answer_response, json_response
from app.schemas.calibrations import CalibrationRequest, HostCalibrationRequest
from app.services import calibrations
from app.services.heavy_work import heavy_work
from app.services.host_calibration import HostCalibrations
from datarax.answers.calibrations import CalibrationList, CalibrationProfile
from datarax.estimate.calibrations import get_profile

router = APIRouter(tags=["hardware"], route_class=JsonBodyRoute)
_EXAMPLE = get_profile("published-tpu-jax").to_json()

ProfileId = Annotated[
    str,
    Path(description="a calibration profile's id", max_length=128, examples=["published-tpu-jax"]),
]


@router.get(
    "/v1/calibrations",
    summary="List calibration profiles",
    response_class=Response,
    responses={
        200: {
            "model": CalibrationList,
            "description": "every profile",
            # One real entry, read from the library.
            "content": {"application/json": {"example": {"items": [_EXAMPLE], "total": 1}}},
        },
        **problem_responses(422),
    },
)
async def list_calibrations(
    store: StoreDep,
    limit: Annotated[int, Query(ge=1, le=1000, description="page size", examples=[100])] = 100,
    # SQLite integers are 64-bit: a larger offset would fail in the driver, not be empty.
    offset: Annotated[int, Query(ge=0, le=2**63 - 1, description="profiles to skip")] = 0,
) -> Response:
    """``{"items": [...], "total": n}``: the calibration profiles step estimates are
    priced with, the published ones first, then those fitted or measured here (newest
    first), ``limit`` at a time from ``offset`` (``total`` counts them all). Plans and
    recommendations name one as ``calibration``; without it, a plan uses its hardware
    kind's ``jax`` profile. ``DATARAX_CALIBRATIONS_KEEP`` (default 1,000) stored
    profiles are kept, the newest."""
    return json_response(await calibrations.list_profiles(store, limit, offset))


@router.get(
    "/v1/calibrations/{profile_id}",
    summary="Read one calibration profile",
    response_class=Response,
    responses={
        200: {
            "model": CalibrationProfile,
            "description": "the profile",
            "content": {"application/json": {"example": _EXAMPLE}},
        },
        **problem_responses(404),
    },
)
async def get_calibration(profile_id: ProfileId, store: StoreDep) -> Response:
    """One profile. 404 ``calibration_not_found`` when there is no such id."""
    return json_response(await calibrations.read_profile(store, profile_id))


@router.delete(
    "/v1/calibrations/{profile_id}",
    status_code=204,
    summary="Delete a calibration profile",
    response_class=Response,
    dependencies=[BearerDoc],
    responses={204: {"description": "deleted"}, **problem_responses(401, 404, 409)},
)
async def delete_calibration(profile_id: ProfileId, store: StoreDep) -> Response:
    """Deletes a stored profile (kind ``jobs`` or ``host``); a plan or recommendation that
    names it afterwards is 422 ``unknown_calibration``, plans priced with it keep their
    estimates. 404 ``calibration_not_found``; 409 ``calibration_published`` (the
    published profiles ship with the library), ``calibration_running`` (a host
    calibration still measuring: delete it once done or failed)."""
    await calibrations.delete_profile(store, profile_id)
    return Response(status_code=204)


@router.post(
    "/v1/calibrations",
    summary="Measure the host, or fit a profile on linked jobs' measured steps",
    status_code=201,
    response_class=Response,
    dependencies=[BearerDoc, JsonBody],
    responses={
        201: {
            "model": CalibrationProfile,
            "description": "kind jobs: the profile, stored; Location: /v1/calibrations/{id}",
        },
        202: {
            "model": CalibrationProfile,
            "description": "kind host: the profile, measuring (status running); "
            "Location: /v1/calibrations/{id}, which shows its progress",
        },
        **problem_responses(401, 404, 409, 415, 422, 499, 503),
    },
)
async def create_calibration(
    body: Annotated[
        CalibrationRequest,
        Body(
            openapi_examples={
                "host": {"summary": "measure the host", "value": {"kind": "host"}},
                "jobs": {
                    "summary": "fit on linked jobs",
                    "value": {"kind": "jobs", "jobs": ["run-1"]},
                },
            }
        ),
    ],
    request: Request,
    store: StoreDep,
) -> Response:
    """``{"kind": "host"}``: the runtime measures the live devices a stage at a time
    (a trivial step's overhead, matmuls in bfloat16 and float32, the platform's
    attention kernel forward and backward, HBM bandwidth, all-gather, reduce-scatter,
    all-reduce and all-to-all), then the constants are fitted on what it measured and
    stored with the rows and the JAX and jaxlib versions (202, ``Location``; poll it:
    ``status`` goes ``running`` -> ``done`` or ``failed``, ``progress`` names the stages
    done). ``quick`` (default true) takes about 10 s on a two-core host with 8 CPU
    devices. A plan on hardware whose ``device_kind`` matches then uses the newest done
    host profile by default. 409 ``calibration_running`` while one measures; 422
    ``invalid_calibration`` when no catalog entry describes the devices (name one as
    ``hardware``); 503 ``worker_lost`` when the runtime is down.

    ``{"kind": "jobs", "jobs": [...]}``: each job's plan re-priced into the step
    model's parts, the median of its measured step times (its ``step_time_metric``), the
    constants fitted on those pairs by the grid search the published profiles come from,
    and the profile stored (201, ``Location``). Its ``error`` gives the fit's mean
    absolute error on the jobs, the published profile's, and, from 3 jobs, the
    leave-one-out error; ``warnings`` (omitted when empty) names each constant the fit put
    at an edge of its grid. 404 ``job_not_found``; 409 ``job_not_linked`` (a job linked to
    no plan) and ``no_measured_steps`` (no step time from a nanosecond to 116 days); 422
    for plans of different accelerator kinds, ``invalid_calibration`` for steps no fit
    can take, and ``calibration_too_large``: the fit's grid cells (jobs x 23,760 grid
    points, twice from 3 jobs for the leave-one-out refits) are counted before any work
    and may be at most ``DATARAX_MAX_CALIBRATION_CELLS`` (default 20,000,000); the
    problem carries ``cells``, ``limit`` and ``max_jobs``. The fit is heavy work, off the
    event loop (503 ``busy``, 499 ``request_abandoned``, 503 ``shutting_down`` as for
    recommendations); nothing is stored unless it succeeds."""
    settings = request.app.state.settings
    if isinstance(body, HostCalibrationRequest):
        hosts: HostCalibrations = request.app.state.host_calibrations
        answer = await hosts.start(body.quick, body.hardware)
        return answer_response(answer, 202, {"location": f"/v1/calibrations/{answer.id}"})
    profile, text = await calibrations.calibrate_jobs(
        store,
        body.jobs,
        body.framework,
        lane=heavy_work(request.app),
        client_gone=request.is_disconnected,
        max_cells=settings.max_calibration_cells,
        keep=settings.calibrations_keep,
    )
    return json_response(text, 201, {"location": f"/v1/calibrations/{profile.id}"})
