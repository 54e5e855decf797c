"""Mesh recommendations over HTTP: ``POST /v1/recommendations``.

HTTP only; :mod:`app.services.hardware` does the work."""

from __future__ import annotations

import json
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Body
from starlette.responses import Response

from app.deps import BearerDoc, JsonBody
from app.openapi import problem_responses
from app.routing import json_response
from app.schemas.hardware import RECOMMENDATION_EXAMPLE, RecommendationRequest, Recommendations
from app.services import hardware

router = APIRouter(tags=["hardware"])


@router.post(
    "/v1/recommendations",
    summary="Recommend meshes",
    response_class=Response,
    dependencies=[JsonBody, BearerDoc],
    responses={
        200: {"model": Recommendations, "description": "the top_k candidates, best first"},
        **problem_responses(401, 413, 415, 422),
    },
)
async def recommend_meshes(
    body: Annotated[
        RecommendationRequest,
        Body(
            openapi_examples={
                "v5e": {"summary": "2 v5e 4x4 slices", "value": RECOMMENDATION_EXAMPLE}
            }
        ),
    ],
) -> Response:
    """Enumerates every (ici, dcn) factorisation of the cluster over ``axes``, rejects what
    does not fit HBM or divide the batch (counted by code in ``rejected``), ranks the rest
    by estimated step time and answers the ``top_k``. Each candidate's ``plan_request`` is
    a ``POST /v1/meshes`` body as it is.

    Step times are a model (see ``step_estimate``), not a measurement. 422 codes:
    ``no_plan_fits`` (the detail says what would fit: more devices, ``remat: full``, a
    smaller batch), ``unknown_hardware``, ``invalid_topology``, ``missing_topology``,
    ``option_not_applicable``, ``invalid_host_count``, ``invalid_model``,
    ``unknown_axis_role``, ``invalid_axis_name``, ``validation_error``.
    """
    answer = await anyio.to_thread.run_sync(lambda: hardware.recommend(body))
    return json_response(json.dumps(answer, separators=(",", ":"), allow_nan=False))
