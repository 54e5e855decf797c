"""Mesh recommendations over HTTP: ``POST /v1/recommendations``.

HTTP only; :mod:`app.services.hardware` does the work."""

from __future__ import annotations

from typing import Annotated

import orjson
from fastapi import APIRouter, Body, Request
from starlette.responses import Response

from app.api.deps import BearerDoc, JsonBody, StoreDep
from app.api.openapi import problem_responses
from app.api.routing import JsonBodyRoute, json_response
from app.schemas.hardware import RECOMMENDATION_EXAMPLE
from app.schemas.serving import (
    SERVING_RECOMMENDATION_EXAMPLE,
    RecommendationBody,
    ServingRecommendationRequest,
)
from app.services import calibrations, hardware, serving
from app.services.heavy_work import heavy_work
from datarax.answers.estimates import Recommendations
from datarax.answers.serving import ServingRecommendations

router = APIRouter(tags=["hardware"], route_class=JsonBodyRoute)


@router.post(
    "/v1/recommendations",
    summary="Recommend meshes",
    response_class=Response,
    dependencies=[JsonBody, BearerDoc],
    responses={
        200: {
            "model": Recommendations | ServingRecommendations,
            "description": "the top_k candidates, best first",
        },
        **problem_responses(401, 413, 415, 422, 499, 503),
    },
)
async def recommend_meshes(
    payload: Annotated[
        RecommendationBody,
        Body(
            openapi_examples={
                "v5e": {"summary": "2 v5e 4x4 slices", "value": RECOMMENDATION_EXAMPLE},
                "serving": {
                    "summary": "serving layouts with an SLO",
                    "value": SERVING_RECOMMENDATION_EXAMPLE,
                },
            }
        ),
    ],
    request: Request,
    store: StoreDep,
) -> Response:
    """Enumerates every (ici, dcn) factorisation of the cluster over ``axes``, rejects what
    does not fit HBM or divide the batch (counted by code in ``rejected``), ranks the rest
    by estimated step time and answers the ``top_k``. Each candidate's ``plan_request`` is
    a ``POST /v1/meshes`` body as it is.

    Step times are a model (see ``step_estimate``), not a measurement. 422 codes:
    ``no_plan_fits`` (the detail says what would fit: more devices, ``remat: full``, a
    smaller batch), ``unknown_hardware``, ``invalid_topology``, ``missing_topology``,
    ``option_not_applicable``, ``invalid_host_count``, ``invalid_model``,
    ``unknown_axis_role``, ``invalid_axis_name``, ``validation_error``,
    ``too_many_devices`` (a cluster above 262,144 devices), and
    ``search_space_too_large``: the search space (ICI x DCN factorisations over
    ``axes``, after ``fixed_ici`` / ``fixed_dcn``) is counted before any work and may
    cost at most ``DATARAX_MAX_SEARCH_SPACE`` (default 20,000) units of work: a candidate
    of a model with up to 16 parameter groups (any dense or mixture-of-experts
    transformer but the largest, whatever its layers) is one unit, one with more groups
    ``groups / 16`` units; the problem carries ``search_space``, ``limit`` (the candidates
    of this model the budget affords) and ``suggestions`` (request changes that shrink
    it: DCN over one axis, a fixed ICI size, fewer axes, fewer slices or hosts).

    Heavy work: at most ``DATARAX_HEAVY_WORKERS`` searches at once and
    ``DATARAX_HEAVY_QUEUE`` waiting (then 503 ``busy`` with ``Retry-After``); a search
    whose client disconnects is abandoned within ~0.1 s (499 ``request_abandoned``), one
    cut by SIGTERM answers 503 ``shutting_down``.

    With ``serving`` (and ``slo``), the body is a serving deployment's (DESIGN v1.4): every
    tensor, expert, stage and replica split is priced and the layouts that fit and meet
    the slo are ranked by output tokens per second per device; ``rejections`` says why
    each other one failed.
    """
    body = payload.root
    if isinstance(body, ServingRecommendationRequest):
        content = await heavy_work(request.app).run(
            "serving recommendation",
            lambda stop: orjson.dumps(serving.recommend(body, should_stop=stop).to_json()),
            request.is_disconnected,
        )
        return json_response(content)
    settings = request.app.state.settings
    # a stored one read back; without one, the newest host profile of its devices
    profile = await calibrations.resolve(store, body.calibration, body.hardware)
    # the answer (up to 100 candidates, ~0.3 MB) is encoded on the lane too
    content = await heavy_work(request.app).run(
        "recommendation",
        lambda stop: orjson.dumps(
            hardware.recommend(
                body, max_search_space=settings.max_search_space, should_stop=stop, profile=profile
            ).to_json()
        ),
        request.is_disconnected,
    )
    return json_response(content)
