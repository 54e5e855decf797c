"""Training sessions over HTTP: HTTP only (:mod:`app.services.sessions` does the work)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query, Request
from starlette.responses import Response

from app.deps import BearerDoc, JsonBody, SessionsDep
from app.openapi import problem_responses
from app.routing import NPZ_MEDIA_TYPE, json_response, media_type
from app.schemas.sessions import (
    SESSION_REQUEST_EXAMPLE,
    STEP_REQUEST_EXAMPLE,
    SessionCreateRequest,
    SessionOut,
    StepResponse,
)

router = APIRouter(tags=["sessions"])

SessionId = Annotated[str, Path(description="session id, e.g. s_01J...", max_length=64)]
MeshId = Annotated[str, Path(description="plan id, e.g. m_01J...", max_length=64)]


def _json(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return json_response(json.dumps(value, separators=(",", ":")), status, headers)


@router.post(
    "/v1/meshes/{mesh_id}/sessions",
    status_code=201,
    summary="Create a training session on a live plan",
    response_class=Response,
    dependencies=[JsonBody, BearerDoc],
    responses={
        201: {"model": SessionOut, "description": "the session; Location: /v1/sessions/{id}"},
        **problem_responses(401, 404, 409, 413, 415, 422, 503, 504),
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
    ``invalid_strategy`` (collective needs replicated parameters), ``validation_error``,
    ``insufficient_memory`` (parameters, optimizer state and gradients would not fit the
    memory budget beside the other sessions: ``DATARAX_MEMORY_FRACTION``); 503
    ``worker_lost`` while the runtime is down.
    """
    record = await sessions.create(mesh_id, body)
    return _json(record, 201, {"Location": f"/v1/sessions/{record['id']}"})


@router.get(
    "/v1/sessions/{session_id}",
    summary="Read a session",
    response_class=Response,
    responses={200: {"model": SessionOut}, **problem_responses(404, 410, 503)},
)
async def get_session(session_id: SessionId, sessions: SessionsDep) -> Response:
    """Step count, last loss and parameter layouts, read from the runtime's live arrays.

    404 ``session_not_found``; 410 ``session_lost`` after a runtime restart; 503
    ``worker_lost`` while the runtime is down.
    """
    return _json(await sessions.read(session_id))


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
        200: {"model": StepResponse, "description": "losses of the steps just run"},
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
    its activations would not fit); 410 ``session_lost``; 503
    ``worker_lost``; 504 ``step_timeout`` (the runtime is restarted).
    """
    result = await sessions.run_steps(
        session_id,
        await request.body(),
        media_type(request),
        request.headers.get("content-type"),
        steps,
    )
    return _json(result)
