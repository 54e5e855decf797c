"""Training sessions: place the built-in MLP on a live plan's mesh and run sharded steps.

Parameters live in the runtime process; the store keeps each session's metadata (spec,
step count, last loss, layouts). After a runtime restart the parameters are gone and the
session answers 410 ``session_lost`` (its metadata stays readable in the store until it is
deleted). Device work is serialised FIFO in the runtime: steps of one session never
interleave, and concurrent calls on one session add up (N calls of k steps end at N*k).
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, Body, Path, Query, Request
from starlette.responses import Response

from app.deps import (
    NPZ_MEDIA_TYPE,
    BearerDoc,
    JsonBody,
    RuntimeDep,
    SettingsDep,
    StoreDep,
    is_json_media,
    media_type,
)
from app.errors import (
    InvalidNpz,
    InvalidParameter,
    MeshNotFound,
    PlanNotLive,
    SessionNotFound,
    UnsupportedMediaType,
    WorkerUnavailable,
)
from app.metrics_io import decode_json_metrics, load_npz
from app.plans import new_ulid, utc_now
from app.routes.metrics import parse_json_model
from app.schemas import (
    SESSION_REQUEST_EXAMPLE,
    STEP_REQUEST_EXAMPLE,
    SessionCreateRequest,
    SessionOut,
    StepRequest,
    StepResponse,
    problem_responses,
)

router = APIRouter(tags=["sessions"])

SessionId = Annotated[str, Path(description="session id, e.g. s_01J...", max_length=64)]
MeshId = Annotated[str, Path(description="plan id, e.g. m_01J...", max_length=64)]

# Metadata writes after a step must not go backwards when calls finish out of order.
_metadata_lock = asyncio.Lock()


def _json(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    text = json.dumps(value, separators=(",", ":"))
    return Response(text, status_code=status, media_type="application/json", headers=headers)


def _batch_axes(plan: dict[str, Any]) -> list[str] | None:
    """The plan's batch axes (dimension 0 of its batch spec), or None for the default."""
    batch = plan.get("batch")
    if not batch:
        return None
    first = batch["spec"][0]
    if first is None:
        return []
    return list(first) if isinstance(first, list) else [first]


def _require_ready(runtime: Any) -> None:
    if not runtime.ready:
        raise WorkerUnavailable("the device runtime is not ready; retry shortly")


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
    store: StoreDep,
    runtime: RuntimeDep,
    settings: SettingsDep,
) -> Response:
    """Places the built-in MLP and its optimizer on the plan's devices.

    404 ``mesh_not_found``; 409 ``plan_not_live`` for abstract plans; 422
    ``invalid_strategy`` (collective needs replicated parameters), ``validation_error``,
    ``insufficient_memory`` (parameters, optimizer state and gradients would not fit the
    memory budget beside the other sessions: ``DATARAX_MEMORY_FRACTION``); 503
    ``worker_lost`` while the runtime is down.
    """
    text = await store.get_plan(mesh_id)
    if text is None:
        raise MeshNotFound(f"no mesh plan with id {mesh_id!r}; create one with POST /v1/meshes")
    plan = json.loads(text)
    if not plan.get("live"):
        raise PlanNotLive(
            f"plan {mesh_id!r} is abstract (planned for {plan.get('total_devices')} devices "
            "without touching them); create a live plan (no num_devices) to train"
        )
    _require_ready(runtime)
    session_id = "s_" + new_ulid()
    spec = body.model_dump()
    payload = {
        "id": session_id,
        "mesh": {
            "axes": plan["axes"],
            "device_grid": plan["device_grid"],
            "batch_axes": _batch_axes(plan),
        },
        # The leader's budgets, so every process of a group admits alike (app.training).
        "memory_budget": runtime.memory_budget(),
        **spec,
    }
    # Creation initialises parameters and optimizer state: bounded like a runtime start,
    # not like a step (DATARAX_STEP_TIMEOUT_S bounds steps).
    result, _ = await runtime.call(
        "session_create", payload, timeout=settings.runtime_start_timeout_s
    )
    created_at = utc_now()
    record = {
        "id": session_id,
        "mesh_id": mesh_id,
        "created_at": created_at,
        "step": 0,
        "last_loss": None,
        **spec,
        "params": result["params"],
    }
    await store.insert_session(session_id, mesh_id, created_at, json.dumps(record))
    return _json(record, 201, {"Location": f"/v1/sessions/{session_id}"})


async def _record(store: Any, session_id: str) -> dict[str, Any]:
    text = await store.get_session(session_id)
    if text is None:
        raise SessionNotFound(f"no session with id {session_id!r}")
    return json.loads(text)


@router.get(
    "/v1/sessions/{session_id}",
    summary="Read a session",
    response_class=Response,
    responses={200: {"model": SessionOut}, **problem_responses(404, 410, 503)},
)
async def get_session(session_id: SessionId, store: StoreDep, runtime: RuntimeDep) -> Response:
    """Step count, last loss and parameter layouts, read from the runtime's live arrays.

    404 ``session_not_found``; 410 ``session_lost`` after a runtime restart; 503
    ``worker_lost`` while the runtime is down.
    """
    record = await _record(store, session_id)
    _require_ready(runtime)
    info, _ = await runtime.call("session_info", {"id": session_id})
    record.update(step=info["step"], last_loss=info["last_loss"], params=info["params"])
    return _json(record)


@router.delete(
    "/v1/sessions/{session_id}",
    status_code=204,
    summary="Delete a session",
    response_class=Response,
    dependencies=[BearerDoc],
    responses={204: {"description": "deleted"}, **problem_responses(401, 404)},
)
async def delete_session(session_id: SessionId, store: StoreDep, runtime: RuntimeDep) -> Response:
    """Forgets the session and frees its arrays when the runtime is up."""
    if not await store.delete_session(session_id):
        raise SessionNotFound(f"no session with id {session_id!r}")
    if runtime.ready:
        try:
            await runtime.call("session_delete", {"id": session_id})
        except Exception:  # noqa: BLE001 (the record is gone; the runtime frees it on restart)
            pass
    return Response(status_code=204)


def _check_steps(steps: int, maximum: int, loc: tuple[str, ...]) -> None:
    if not 1 <= steps <= maximum:
        raise InvalidParameter(
            loc, f"steps must be between 1 and {maximum} (DATARAX_MAX_STEPS_PER_CALL), got {steps}"
        )


async def _step_input(
    request: Request, steps_query: int | None, settings: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Reads a JSON or npz step body -> (payload without id, arrays)."""
    media = media_type(request)
    body = await request.body()
    if is_json_media(media):
        parsed = parse_json_model(body, StepRequest)
        steps = steps_query if steps_query is not None else parsed.steps
        _check_steps(steps, settings.max_steps_per_call, ("body", "steps"))
        if (parsed.batch is None) == (parsed.synthetic is None):
            raise InvalidParameter(
                ("body",), "send exactly one of 'batch' (inputs and targets) or 'synthetic'"
            )
        if parsed.synthetic is not None:
            return {"steps": steps, "synthetic": parsed.synthetic.model_dump()}, {}
        raw = {"inputs": parsed.batch.inputs}
        if parsed.batch.targets is not None:
            raw["targets"] = parsed.batch.targets
        arrays = await anyio.to_thread.run_sync(lambda: decode_json_metrics(raw))
        return {"steps": steps}, arrays
    if media == NPZ_MEDIA_TYPE:
        steps = 1 if steps_query is None else steps_query
        _check_steps(steps, settings.max_steps_per_call, ("query", "steps"))
        arrays = await anyio.to_thread.run_sync(
            lambda: load_npz(body, max_bytes=settings.max_body_bytes)
        )
        unknown = sorted(set(arrays) - {"inputs", "targets"})
        if unknown:
            raise InvalidNpz(f"npz arrays {unknown} are not 'inputs' or 'targets'")
        return {"steps": steps}, arrays
    raise UnsupportedMediaType(
        f"Content-Type {request.headers.get('content-type')!r} is not accepted; send "
        f"application/json or {NPZ_MEDIA_TYPE}"
    )


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
    store: StoreDep,
    runtime: RuntimeDep,
    settings: SettingsDep,
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
    await _record(store, session_id)
    payload, arrays = await _step_input(request, steps, settings)
    _require_ready(runtime)
    result, _ = await runtime.call(
        "session_step",
        {"id": session_id, "memory_budget": runtime.memory_budget(), **payload},
        arrays,
        timeout=settings.step_timeout_s,
    )
    async with _metadata_lock:
        record = await _record(store, session_id)
        if result["step"] > record["step"]:
            record.update(step=result["step"], last_loss=result["losses"][-1])
            await store.update_session(session_id, json.dumps(record))
    return _json(result)
