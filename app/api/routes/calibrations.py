"""Calibration profiles over HTTP: ``GET /v1/calibrations`` and
``GET /v1/calibrations/{id}`` (DESIGN v1.3, "Calibrations").

HTTP only; the profiles are :mod:`datarax.estimate.calibrations`' (plain data, no JAX)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from starlette.responses import Response

from app.api.openapi import problem_responses
from app.api.routing import json_response, json_text
from app.core.errors import ServiceError
from app.schemas.calibrations import CalibrationList, CalibrationProfileEntry
from datarax.distributed.errors import PlanError
from datarax.estimate.calibrations import get_profile, published_profiles

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
async def list_calibrations() -> Response:
    """``{"items": [...]}``: the calibration profiles step estimates are priced with.
    Plans and recommendations name one as ``calibration``; without it, a plan uses its
    hardware kind's ``jax`` profile."""
    return json_response(json_text({"items": [p.to_json() for p in published_profiles()]}))


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
async def get_calibration(profile_id: ProfileId) -> Response:
    """One profile. 404 ``calibration_not_found`` when there is no such id."""
    try:
        profile = get_profile(profile_id)
    except PlanError as error:
        raise ServiceError(error.message, code="calibration_not_found") from None
    return json_response(json_text(profile.to_json()))
