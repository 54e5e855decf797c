"""Mesh recommendations over HTTP: ``POST /v1/recommendations``.

HTTP only; :mod:`app.services.hardware` does the work."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Request
from starlette.responses import Response

from app.api.deps import BearerDoc, JsonBody, StoreDep
from app.api.openapi import problem_responses
from app.api.routing import JsonBodyRoute, answer_response
from app.schemas.hardware import RECOMMENDATION_EXAMPLE, RecommendationRequest
from app.services import calibrations, hardware
from app.services.heavy_work import heavy_work
from datarax.answers.estimates import Recommendations

router = APIRouter(tags=["hardware"], route_class=JsonBodyRoute)


@router.post(
    "/v1/recommendations",
    summary="Recommend meshes",
    response_class=Response,
    dependencies=[JsonBody, BearerDoc],
    responses={
        200: {"model": Recommendations, "description": "the top_k candidates, best first"},
        **problem_responses(401, 413, 415, 422, 499, 503),
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
    hold at most ``DATARAX_MAX_SEARCH_SPACE`` (default 20,000) candidates; the problem
    carries ``search_space``, ``limit`` and ``suggestions`` (request changes that shrink
    it: DCN over one axis, a fixed ICI size, fewer axes, fewer slices or hosts).

    Heavy work: at most ``DATARAX_HEAVY_WORKERS`` searches at once and
    ``DATARAX_HEAVY_QUEUE`` waiting (then 503 ``busy`` with ``Retry-After``); a search
    whose client disconnects is abandoned within ~0.1 s (499 ``request_abandoned``), one
    cut by SIGTERM answers 503 ``shutting_down``.
    """
    settings = request.app.state.settings
    # a stored one read back; without one, the newest host profile of its devices
    profile = await calibrations.resolve(store, body.calibration, body.hardware)
    answer = await heavy_work(request.app).run(
        "recommendation",
        lambda stop: hardware.recommend(
            body, max_search_space=settings.max_search_space, should_stop=stop, profile=profile
        ),
        request.is_disconnected,
    )
    return answer_response(answer)
