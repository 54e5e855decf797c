"""Mesh plans over HTTP: create (live or abstract), list, read, delete, draw.

HTTP only; :mod:`app.services.meshes` does the work."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Body, Query, Request
from starlette.responses import Response

from app.api.deps import BEARER_SCHEME, BearerDoc, JsonBody, StoreDep
from app.api.openapi import MeshId, problem_responses
from app.api.routing import JsonBodyRoute, json_response
from app.api.streamed import CompressedAnswer, cached_facts
from app.core.answer_limit import check_answer_size
from app.schemas.meshes import PLAN_REQUEST_EXAMPLE, MeshPlanRequest
from app.services import meshes
from app.services.layout_scope import parse_scope
from datarax.answers.plans import MeshPlan, MeshPlanList, MeshPlanSummary

router = APIRouter(tags=["meshes"], route_class=JsonBodyRoute)


_ABSTRACT_EXAMPLE = {
    "axes": {"data": -1, "fsdp": 16, "model": 16},
    "batch_shape": [131072, 1024],
    "batch_axes": ["data", "fsdp"],
    "num_devices": 65536,
    "name": "pod-plan",
}


@router.post(
    "/v1/meshes",
    status_code=201,
    summary="Plan a mesh",
    response_class=Response,
    # The hot path takes no dependency but the media type's check: the app's parts come
    # from app.state, the bearer scheme is documented, not resolved (the middleware
    # enforces the token).
    dependencies=[JsonBody],
    openapi_extra={"security": [{BEARER_SCHEME: []}]},
    responses={
        201: {
            "model": MeshPlan,
            "description": "the stored plan; Location: /v1/meshes/{id}",
            "headers": {"Location": {"schema": {"type": "string"}}},
        },
        **problem_responses(401, 413, 415, 422, 499, 503, 504),
    },
)
async def create_mesh(
    body: Annotated[
        MeshPlanRequest,
        Body(
            openapi_examples={
                "live": {"summary": "live plan on this service", "value": PLAN_REQUEST_EXAMPLE},
                "abstract": {"summary": "abstract 65,536-device plan", "value": _ABSTRACT_EXAMPLE},
            }
        ),
    ],
    request: Request,
) -> Response:
    """Plans a mesh, stores it and answers it (201, ``Location`` header).

    - ``num_devices`` given: an *abstract* plan for exactly that many devices, numbered
      ``0..n-1`` row-major, all in process 0; no device is touched. ``platform`` is echoed.
    - ``num_devices`` absent/null: a *live* plan on this service's devices, the first
      ``prod(axes)`` of them in JAX's mesh order; fewer than the host has is fine, more is
      ``not_enough_devices``. 503 ``worker_lost`` while the runtime is down.
    - ``hardware`` with ``ici`` (or with ``maxtext``, MaxText's own keys): an abstract plan
      over all the devices of that cluster, in JAX's device order for the hardware.

    The body has no mode tag: the members sent say which mode it is (``MeshPlanRequest``
    is one of ``LivePlanBody``, ``AbstractPlanBody``, ``HardwarePlanBody``,
    ``MaxTextPlanBody``), and a member of another mode is 422 ``validation_error``.

    Shards equal ``NamedSharding(mesh, spec).devices_indices_map(batch_shape)``. 422 codes:
    ``invalid_axis_name``, ``invalid_axis_size``, ``multiple_auto_axes``,
    ``axes_product_mismatch``, ``not_enough_devices``, ``batch_not_divisible`` (nearest
    valid sizes in the detail), ``unknown_batch_axis``, ``duplicate_batch_axis``,
    ``invalid_batch_shape``, ``validation_error``, ``invalid_json``, ``too_many_devices``
    (a hardware cluster above 262,144 devices, the ``num_devices`` cap),
    ``answer_too_large``.

    Plans over 4,096 devices are heavy work: at most ``DATARAX_HEAVY_WORKERS`` at once and
    ``DATARAX_HEAVY_QUEUE`` waiting (then 503 ``busy`` with ``Retry-After``); one whose
    client disconnects is abandoned.
    """
    state = request.app.state
    plan = await meshes.create_plan(
        body.root,  # the mode's typed request, parsed once
        state.store,
        state.runtime,
        lane=state.heavy_work,
        client_gone=request.is_disconnected,
        max_answer_bytes=state.byte_limits.answer,
    )
    state.telemetry.plans_created.labels(kind="live" if plan.live else "abstract").inc()
    return json_response(plan.body, 201, {"Location": f"/v1/meshes/{plan.id}"})


@router.get(
    "/v1/meshes",
    summary="List plans",
    response_class=Response,
    responses={
        200: {"model": MeshPlanList, "description": "stored plans, newest first"},
        **problem_responses(422),
    },
)
async def list_meshes(
    request: Request,
    store: StoreDep,
    limit: Annotated[int, Query(ge=1, le=100, description="page size", examples=[20])] = 20,
    # SQLite integers are 64-bit: a larger offset would fail in the driver, not be empty.
    offset: Annotated[int, Query(ge=0, le=2**63 - 1, description="plans to skip")] = 0,
    view: Annotated[
        Literal["full", "summary"],
        Query(
            description="summary (default): without device_grid and shards; full: whole "
            "plans (a 65,536-device plan is ~8 MB in full, ~1 KB as a summary), refused "
            "with 422 answer_too_large past DATARAX_MAX_ANSWER_MB"
        ),
    ] = "summary",
) -> Response:
    """Stored plans, newest first: ``{"items": [...], "total": n}`` (``total`` counts all
    stored plans, not just this page). Summaries by default; full plans one by one at
    ``/v1/meshes/{id}``."""
    text = await meshes.list_plans(
        store,
        limit,
        offset,
        summary=view == "summary",
        max_bytes=request.app.state.byte_limits.answer,
    )
    return json_response(text)


@router.get(
    "/v1/meshes/{mesh_id}",
    summary="Read a plan",
    response_class=Response,
    responses={
        200: {
            "model": MeshPlan | MeshPlanSummary,
            "description": "the stored plan (view=summary: without device_grid and shards)",
        },
        **problem_responses(404),
    },
)
async def get_mesh(
    mesh_id: MeshId,
    store: StoreDep,
    view: Annotated[
        Literal["full", "summary"],
        Query(
            description="full (default): the plan as answered when created; summary: "
            "without device_grid and shards (what GET /v1/meshes lists)"
        ),
    ] = "full",
) -> Response:
    """The stored plan, exactly as it was answered when created. 404 ``mesh_not_found``."""
    if view == "summary":
        return json_response(await meshes.get_plan_summary(store, mesh_id))
    stored = await meshes.get_plan_stored(store, mesh_id)
    if isinstance(stored, bytes):  # a large plan: sent from its compressed form
        facts = await cached_facts(mesh_id, stored)
        check_answer_size(facts.length, "the plan")  # measured before gzip, as every answer
        return CompressedAnswer(stored, facts)
    return json_response(stored)


@router.delete(
    "/v1/meshes/{mesh_id}",
    status_code=204,
    summary="Forget a plan",
    response_class=Response,
    dependencies=[BearerDoc],
    responses={204: {"description": "deleted"}, **problem_responses(401, 404)},
)
async def delete_mesh(mesh_id: MeshId, store: StoreDep, request: Request) -> Response:
    """Deletes a stored plan and ends its training sessions (each deleted as ``DELETE
    /v1/sessions/{id}`` deletes it: queued steps cancelled, the arrays freed). 404
    ``mesh_not_found`` when there is none."""
    await meshes.delete_plan(store, mesh_id)
    sessions = getattr(request.app.state, "sessions", None)
    if sessions is not None:
        await sessions.delete_mesh_sessions(mesh_id)
    return Response(status_code=204)


_LayoutRange = Annotated[
    str | None,
    Query(
        max_length=19,
        pattern=r"^\d{1,9}(-\d{1,9})?$",
        description="N or N-M (inclusive): draw only these devices",
    ),
]


@router.get(
    "/v1/meshes/{mesh_id}/layout.svg",
    summary="Draw a plan",
    response_class=Response,
    responses={
        200: {
            "content": {"image/svg+xml": {"schema": {"type": "string"}}},
            "description": "the device grid coloured by batch slice",
        },
        **problem_responses(404, 422),
    },
)
async def get_mesh_layout(
    mesh_id: MeshId,
    store: StoreDep,
    slice: _LayoutRange = None,
    host: _LayoutRange = None,
    process: _LayoutRange = None,
    positions: _LayoutRange = None,
) -> Response:
    """An SVG of the device grid: every device labelled with its id and mesh coordinates,
    coloured by the batch slice it holds (replicas share a colour), with axis names and a
    legend. Over 256 devices, a summary grid of at most 64 blocks (slices, hosts,
    processes, rows of the leading axes or runs of devices), each a link to the picture of
    its own devices (``?slice=3``). ``slice``, ``host``, ``process`` and ``positions``
    (mesh order) each take ``N`` or ``N-M`` and draw only the devices they select; one
    that selects none is 422 ``validation_error``."""
    scope = parse_scope({"slice": slice, "host": host, "process": process, "positions": positions})
    svg = await meshes.layout_svg(store, mesh_id, scope)
    return Response(svg, media_type="image/svg+xml")
