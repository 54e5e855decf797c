"""Compile checks over HTTP: start one on a plan, read, list, cancel.

HTTP only; :mod:`app.services.compile_checks` does the work."""

from __future__ import annotations

from typing import Annotated

import orjson
from fastapi import APIRouter, Body, Depends, Path, Query, Request
from starlette.responses import Response

from app.api.deps import BearerDoc, JsonBody, StoreDep
from app.api.openapi import MeshId, problem_responses
from app.api.routing import JsonBodyRoute, answer_response
from app.core.threads import run_for_body
from app.schemas.compile_checks import COMPILE_CHECK_EXAMPLE, CompileCheckRequest
from app.services import meshes
from app.services.compile_checks import CompileChecks
from datarax.answers.compile_checks import CompileCheck, CompileCheckList

router = APIRouter(tags=["meshes"], route_class=JsonBodyRoute)

CheckId = Annotated[
    str,
    Path(
        description="check id, e.g. c_01J...",
        max_length=64,
        examples=["c_01JABCDEFGHJKMNPQRSTVWXYZ0"],
    ),
]


async def _checks(request: Request) -> CompileChecks:
    return request.app.state.compile_checks


ChecksDep = Annotated[CompileChecks, Depends(_checks)]


@router.post(
    "/v1/meshes/{mesh_id}/compile-checks",
    status_code=202,
    summary="Ask XLA whether a plan's training step fits",
    response_class=Response,
    dependencies=[JsonBody, BearerDoc],
    responses={
        202: {
            "model": CompileCheck,
            "description": "the check (queued, or done from the cache); "
            "Location: /v1/compile-checks/{id}",
            "headers": {"Location": {"schema": {"type": "string"}}},
        },
        **problem_responses(401, 404, 415, 422, 429),
    },
)
async def create_compile_check(
    mesh_id: MeshId,
    body: Annotated[CompileCheckRequest, Body(examples=[COMPILE_CHECK_EXAMPLE])],
    store: StoreDep,
    checks: ChecksDep,
) -> Response:
    """Compiles the real training step (forward, backward, optimizer update) of ``model``
    on the plan's mesh, in the plan's device order, and answers 202 with the check; poll
    ``Location``. TPU hardware plans compile through libtpu; live plans on the host's own
    CPU or GPU devices. 404 ``mesh_not_found``; 422 ``compile_target_unavailable`` (GPU hardware,
    plain abstract plans; the body carries ``estimate``), the model and batch codes; 429
    ``compile_queue_full`` with ``Retry-After``."""
    text = await meshes.get_plan(store, mesh_id)
    # A stored plan is up to ~27 MB (262,144 devices): parsed in a worker thread above
    # 64 KiB, as request bodies are, never on the event loop.
    plan = await run_for_body(lambda: orjson.loads(text), len(text))
    check = await checks.submit(mesh_id, plan, body)
    return answer_response(check, 202, {"Location": f"/v1/compile-checks/{check.id}"})


@router.get(
    "/v1/meshes/{mesh_id}/compile-checks",
    summary="List a plan's compile checks",
    response_class=Response,
    responses={200: {"model": CompileCheckList}, **problem_responses(404, 422)},
)
async def list_compile_checks(
    mesh_id: MeshId,
    store: StoreDep,
    checks: ChecksDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    offset: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
) -> Response:
    """The plan's checks, newest first: ``{"items", "total"}``. 404 ``mesh_not_found``."""
    await meshes.get_plan(store, mesh_id)
    return answer_response(await checks.list(mesh_id, limit, offset))


@router.get(
    "/v1/compile-checks/{check_id}",
    summary="Read a compile check",
    response_class=Response,
    responses={200: {"model": CompileCheck}, **problem_responses(404)},
)
async def get_compile_check(check_id: CheckId, checks: ChecksDep) -> Response:
    """``status``: ``queued`` (with ``position``), ``compiling`` (with ``phase``:
    ``starting``, ``lowering`` or ``compiling``), ``done`` (``result``, ``estimate_error``),
    ``failed`` (``error``: a worker that died names its signal) or ``cancelled``.
    ``result.fits`` is true or false against the target's memory, or null (unknown, with
    ``result.fits_reason``) where there is no memory figure to compare with. 404
    ``compile_check_not_found``."""
    return answer_response(await checks.get(check_id))


@router.delete(
    "/v1/compile-checks/{check_id}",
    summary="Cancel a compile check",
    response_class=Response,
    dependencies=[BearerDoc],
    responses={200: {"model": CompileCheck}, **problem_responses(401, 404)},
)
async def cancel_compile_check(check_id: CheckId, checks: ChecksDep) -> Response:
    """Cancels a check in any phase (queued, its worker starting, lowering, compiling) and
    answers it (``cancelled``); a finished check, or one whose answer was already in, is
    answered as it is. 404 ``compile_check_not_found``."""
    return answer_response(await checks.cancel(check_id))
