"""Training sessions over HTTP: HTTP only (:mod:`app.services.sessions` does the work)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path, Query, Request
from starlette.responses import Response

from app.api.deps import BearerDoc, JsonBody, SessionsDep
from app.api.openapi import MeshId, problem_responses
from app.api.routing import JsonBodyRoute, answer_response, media_type
from app.codecs.media import NPZ_MEDIA_TYPE
from app.schemas.sessions import (
    SESSION_REQUEST_EXAMPLE,
    STEP_REQUEST_EXAMPLE,
    GenerateRequest,
    SessionCreateRequest,
)
from app.services.sessions import MAX_LIST_LIMIT
from datarax.answers.sessions import GeneratedTokens, Session, SessionList, StepAnswer

router = APIRouter(tags=["sessions"], route_class=JsonBodyRoute)

SessionId = Annotated[
    str,
    Path(
        description="session id, e.g. s_01J...",
        max_length=64,
        examples=["s_01JABCDEFGHJKMNPQRSTVWXYZ0"],
    ),
]
Limit = Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT, description="page size", examples=[20])]
# SQLite integers are 64-bit: a larger offset would fail in the driver, not be empty.
Offset = Annotated[int, Query(ge=0, le=2**63 - 1, description="sessions to skip")]


@router.post(
    "/v1/meshes/{mesh_id}/sessions",
    status_code=201,
    summary="Create a training session on a live plan",
    response_class=Response,
    dependencies=[JsonBody, BearerDoc],
    responses={
        201: {"model": Session, "description": "the session; Location: /v1/sessions/{id}"},
        **problem_responses(401, 404, 409, 413, 415, 422, 429, 503, 504),
    },
)
async def create_session(
    mesh_id: MeshId,
    body: Annotated[
        SessionCreateRequest,
        Body(openapi_examples={"mlp": {"summary": "small MLP", "value": SESSION_REQUEST_EXAMPLE}}),
    ],
    sessions: SessionsDep,
) -> Response:
    """Places the built-in MLP and its optimizer on the plan's devices.

    404 ``mesh_not_found``; 409 ``plan_not_live`` for abstract plans; 422
    ``invalid_strategy`` (collective needs replicated parameters), ``validation_error``
    (a transformer's ``seq_len`` over 131,072 among others),
    ``insufficient_memory`` (parameters, optimizer state and gradients would not fit the
    memory budget beside the other sessions: ``DATARAX_MEMORY_FRACTION``),
    ``model_too_large`` (a parameter array past 2**31 - 1 elements); 429
    ``too_many_sessions`` (``DATARAX_MAX_SESSIONS`` are live); 503
    ``worker_lost`` while the runtime is down.
    """
    session = await sessions.create(mesh_id, body)
    return answer_response(session, 201, {"Location": f"/v1/sessions/{session.id}"})


@router.get(
    "/v1/sessions",
    summary="List sessions",
    response_class=Response,
    responses={200: {"model": SessionList}, **problem_responses(422)},
)
async def list_sessions(sessions: SessionsDep, limit: Limit = 20, offset: Offset = 0) -> Response:
    """Stored sessions, newest first, without parameter layouts: ``{"items": [...],
    "total": n}``; each item's ``state`` is ``live``, ``expired`` or ``lost``. Read from the
    store (no device work); pages of at most 100.
    """
    return answer_response(await sessions.list_sessions(limit, offset))


@router.get(
    "/v1/meshes/{mesh_id}/sessions",
    summary="List a plan's sessions",
    response_class=Response,
    responses={200: {"model": SessionList}, **problem_responses(404, 422)},
)
async def list_plan_sessions(
    mesh_id: MeshId, sessions: SessionsDep, limit: Limit = 20, offset: Offset = 0
) -> Response:
    """The sessions created on plan ``mesh_id``, as ``GET /v1/sessions`` lists them.

    404 ``mesh_not_found``.
    """
    return answer_response(await sessions.list_sessions(limit, offset, mesh_id))


@router.get(
    "/v1/sessions/{session_id}",
    summary="Read a session",
    response_class=Response,
    responses={200: {"model": Session}, **problem_responses(404, 410, 503)},
)
async def get_session(session_id: SessionId, sessions: SessionsDep) -> Response:
    """Step count, last loss (``null`` when non-finite), parameter layouts and the loss
    history (``loss_history``: at most 2,000 evenly spaced ``[step, loss]`` points), from
    what the service recorded: a read queues no device work.

    404 ``session_not_found``; 410 ``session_lost`` after a runtime restart, or on a
    replica other than the one holding it (the detail names that one),
    ``session_expired`` after ``DATARAX_SESSION_IDLE_S`` without a step; 503
    ``worker_lost`` while the runtime is down.
    """
    return answer_response(await sessions.read(session_id))


@router.delete(
    "/v1/sessions/{session_id}",
    status_code=204,
    summary="Delete a session",
    response_class=Response,
    dependencies=[BearerDoc],
    responses={204: {"description": "deleted"}, **problem_responses(401, 404)},
)
async def delete_session(session_id: SessionId, sessions: SessionsDep) -> Response:
    """Forgets the session and frees its arrays when the runtime is up."""
    await sessions.delete(session_id)
    return Response(status_code=204)


@router.post(
    "/v1/sessions/{session_id}/steps",
    summary="Run sharded training steps",
    response_class=Response,
    dependencies=[BearerDoc],
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "JSON, or an np.savez archive (application/x-npz) with 'inputs' "
            "and 'targets' and ?steps=K",
            "content": {
                "application/json": {
                    "schema": {"$ref": "#/components/schemas/StepRequest"},
                    "example": STEP_REQUEST_EXAMPLE,
                },
                NPZ_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}},
            },
        }
    },
    responses={
        200: {"model": StepAnswer, "description": "losses of the steps just run"},
        **problem_responses(401, 404, 410, 413, 415, 422, 503, 504),
    },
)
async def run_steps(
    session_id: SessionId,
    request: Request,
    sessions: SessionsDep,
    steps: Annotated[
        int | None, Query(description="npz bodies: steps to run (JSON: overrides body)")
    ] = None,
) -> Response:
    """Runs K steps on the session's mesh with a given (same every step) or synthetic batch.

    A refused request changes nothing. 422: ``validation_error`` (steps out of range, both
    or neither of batch/synthetic), ``batch_shape_mismatch``, ``missing_targets``,
    ``invalid_targets``, ``batch_not_divisible``, ``insufficient_memory`` (the batch and
    its activations would not fit: a transformer's by the estimate before anything is
    lowered, then by XLA's figure), ``model_too_large`` (an array of the step past
    2**31 - 1 elements, refused before anything is lowered); 410 ``session_lost`` (the
    runtime restarted, or the session lives on another replica: the detail says which);
    503 ``worker_lost``; 504 ``step_timeout`` (the runtime is restarted).
    """
    result = await sessions.run_steps(
        session_id,
        await request.body(),
        media_type(request),
        request.headers.get("content-type"),
        steps,
    )
    return answer_response(result)


@router.post(
    "/v1/sessions/{session_id}/generate",
    summary="Generate tokens from a transformer session",
    response_class=Response,
    dependencies=[JsonBody, BearerDoc],
    responses={
        200: {"model": GeneratedTokens, "description": "the greedy tokens after each row"},
        **problem_responses(401, 404, 410, 413, 415, 422, 503, 504),
    },
)
async def generate_tokens(
    session_id: SessionId, body: Annotated[GenerateRequest, Body()], sessions: SessionsDep
) -> Response:
    """``steps`` greedy tokens after each row of ``prompt`` from the session's
    transformer as it is now: one prefill, then KV-cached decode steps
    (``datarax.models.decode``) on the session's devices. Nothing is trained.

    422 ``validation_error`` (an MLP session, ragged or over-long rows, an id past the
    vocabulary); 404 ``session_not_found``; 410 ``session_lost``, ``session_expired``;
    503 ``worker_lost``; 504 ``step_timeout``.
    """
    return answer_response(await sessions.generate(session_id, body))
