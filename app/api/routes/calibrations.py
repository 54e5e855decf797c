"""Calibration profiles over HTTP: ``GET /v1/calibrations`` and
``GET /v1/calibrations/{id}`` (DESIGN v1.3, "Calibrations").

HTTP only; the profiles are :mod:`datarax.estimate.calibrations`' (plain data, no JAX)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from starlette.responses import Response

from app.api.deps import BearerDoc, JsonBody, StoreDep
from app.api.openapi import problem_responses
from app.api.routing import json_response, json_text
from app.schemas.calibrations import (
    CalibrationList,
    CalibrationProfileEntry,
    CalibrationRequest,
)
from app.services import calibrations
from datarax.estimate.calibrations import get_profile

router = APIRouter(tags=["hardware"])
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
    return json_response(json_text(await calibrations.list_profiles(store)))


@router.get(
    "/v1/calibrations/{profile_id}",
    summary="Read one calibration profile",
    response_class=Response,
    responses={
        200: {
            "model": CalibrationProfileEntry,
            "description": "the profile",
            "content": {"application/json": {"example": _EXAMPLE}},
        },
        **problem_responses(404),
    },
)
async def get_calibration(profile_id: ProfileId, store: StoreDep) -> Response:
    """One profile. 404 ``calibration_not_found`` when there is no such id."""
    return json_response(json_text(await calibrations.read_profile(store, profile_id)))


@router.post(
    "/v1/calibrations",
    summary="Fit a calibration profile on linked jobs' measured steps",
    status_code=201,
    response_class=Response,
    dependencies=[BearerDoc, JsonBody],
    responses={
        201: {
            "model": CalibrationProfileEntry,
            "description": "the profile, stored; Location: /v1/calibrations/{id}",
        },
        **problem_responses(401, 404, 409, 415, 422),
    },
)
async def create_calibration(body: CalibrationRequest, store: StoreDep) -> Response:
    """``{"kind": "jobs", "jobs": [...]}``: each job's plan re-priced into the step
    model's parts, the median of its measured step times (its ``step_time_metric``), the
    constants fitted on those pairs by the grid search the published profiles come from,
    and the profile stored (201, ``Location``). Its ``error`` gives the fit's mean
    absolute error on the jobs, the published profile's, and, from 3 jobs, the
    leave-one-out error. 404 ``job_not_found``; 409 ``job_not_linked`` (a job linked to
    no plan) and ``no_measured_steps``; 422 for plans of different accelerator kinds."""
    answer = await calibrations.calibrate_jobs(store, body.jobs, body.framework)
    location = {"location": f"/v1/calibrations/{answer['id']}"}
    return json_response(json_text(answer), 201, location)
