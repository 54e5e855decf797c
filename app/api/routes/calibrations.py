"""Calibration profiles over HTTP: ``GET /v1/calibrations`` and
``GET /v1/calibrations/{id}`` (DESIGN v1.3, "Calibrations").

HTTP only; the profiles are :mod:`datarax.estimate.calibrations`' (plain data, no JAX)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path, Request
from starlette.responses import Response

from app.api.deps import BearerDoc, JsonBody, StoreDep
from app.api.openapi import problem_responses
from app.api.routing import JsonBodyRoute, answer_response, json_response
from app.schemas.calibrations import CalibrationRequest, HostCalibrationRequest
from app.services import calibrations
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
            "content": {"application/json": {"example": {"items": [_EXAMPLE]}}},
        }
    },
)
async def list_calibrations(store: StoreDep) -> Response:
    """``{"items": [...]}``: the calibration profiles step estimates are priced with, the
    published ones first, then those fitted here (newest first). Plans and
    recommendations name one as ``calibration``; without it, a plan uses its hardware
    kind's ``jax`` profile."""
    return json_response(await calibrations.list_profiles(store))


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
        **problem_responses(401, 404, 409, 415, 422, 503),
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
    leave-one-out error. 404 ``job_not_found``; 409 ``job_not_linked`` (a job linked to
    no plan) and ``no_measured_steps``; 422 for plans of different accelerator kinds."""
    if isinstance(body, HostCalibrationRequest):
        hosts: HostCalibrations = request.app.state.host_calibrations
        answer = await hosts.start(body.quick, body.hardware)
        status = 202
    else:
        answer = await calibrations.calibrate_jobs(store, body.jobs, body.framework)
        status = 201
    return answer_response(answer, status, {"location": f"/v1/calibrations/{answer.id}"})
