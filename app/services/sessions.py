"""Training sessions as a service: place the built-in MLP on a live plan and run steps.

Parameters live in the runtime process; the store keeps each session's metadata (spec,
step count, last loss, layouts). After a runtime restart the parameters are gone and the
session answers 410 ``session_lost`` (its metadata stays readable in the store until it is
deleted). Device work is serialised FIFO in the runtime: steps of one session never
interleave, and concurrent calls on one session add up (N calls of k steps end at N*k).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anyio.to_thread

from app.codecs.json_arrays import decode_json_arrays, parse_json_model
from app.codecs.npz import load_npz
from app.errors import (
    InvalidNpz,
    InvalidParameter,
    MeshNotFound,
    PlanNotLive,
    SessionNotFound,
    UnsupportedMediaType,
    WorkerLost,
)
from app.ids import new_session_id, utc_now
from app.routing import NPZ_MEDIA_TYPE, is_json_media
from app.runtime_client import RuntimeClient
from app.schemas.sessions import SessionCreateRequest, StepRequest
from app.settings import Settings
from app.store import Store

BATCH_FIELDS = ("inputs", "targets")


def _batch_axes(plan: dict[str, Any]) -> list[str] | None:
    """The plan's batch axes (dimension 0 of its batch spec), or None for the default."""
    batch = plan.get("batch")
    if not batch:
        return None
    first = batch["spec"][0]
    if first is None:
        return []
    return list(first) if isinstance(first, list) else [first]


def _check_steps(steps: int, maximum: int, loc: tuple[str, ...]) -> None:
    if not 1 <= steps <= maximum:
        raise InvalidParameter(
            loc, f"steps must be between 1 and {maximum} (DATARAX_MAX_STEPS_PER_CALL), got {steps}"
        )


def decode_step_body(
    body: bytes,
    media: str | None,
    content_type: str | None,
    steps_query: int | None,
    settings: Settings,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A JSON or npz step body -> (payload without the session id, batch arrays).

    Raises:
      ServiceError: ``validation_error`` (steps out of range, both or neither of batch and
        synthetic), ``invalid_json``, ``invalid_npz``, ``invalid_tensor``, ``ragged_array``,
        ``unsupported_datatype``, ``payload_too_large``, ``unsupported_media_type``; errors
        about arrays name the batch field.
    """
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
        return {"steps": steps}, decode_json_arrays(raw, what="batch field")
    if media == NPZ_MEDIA_TYPE:
        steps = 1 if steps_query is None else steps_query
        _check_steps(steps, settings.max_steps_per_call, ("query", "steps"))
        arrays = load_npz(body, max_bytes=settings.max_body_bytes)
        unknown = sorted(set(arrays) - set(BATCH_FIELDS))
        if unknown:
            raise InvalidNpz(f"npz arrays {unknown} are not 'inputs' or 'targets'")
        return {"steps": steps}, arrays
    raise UnsupportedMediaType(
        f"Content-Type {content_type!r} is not accepted; send application/json or {NPZ_MEDIA_TYPE}"
    )


class SessionService:
    """Sessions over the store and the runtime client; one per app (built by the lifespan).

    Holds the lock that keeps metadata writes after a step from going backwards when calls
    finish out of order.
    """

    def __init__(self, store: Store, runtime: RuntimeClient, settings: Settings):
        self.store = store
        self.runtime = runtime
        self.settings = settings
        self._metadata_lock = asyncio.Lock()

    def _require_ready(self) -> None:
        if not self.runtime.ready:
            raise WorkerLost("the device runtime is not ready; retry shortly")

    async def record(self, session_id: str) -> dict[str, Any]:
        """The stored record. Raises SessionNotFound."""
        text = await self.store.get_session(session_id)
        if text is None:
            raise SessionNotFound(f"no session with id {session_id!r}")
        return json.loads(text)

    async def create(self, mesh_id: str, body: SessionCreateRequest) -> dict[str, Any]:
        """Places the model and optimizer on a live plan's devices; answers the record.

        Raises:
          MeshNotFound, PlanNotLive, WorkerLost, and the runtime's errors
          (``invalid_strategy``, ``insufficient_memory``, ...).
        """
        text = await self.store.get_plan(mesh_id)
        if text is None:
            raise MeshNotFound(f"no mesh plan with id {mesh_id!r}; create one with POST /v1/meshes")
        plan = json.loads(text)
        if not plan.get("live"):
            raise PlanNotLive(
                f"plan {mesh_id!r} is abstract (planned for {plan.get('total_devices')} devices "
                "without touching them); create a live plan (no num_devices) to train"
            )
        self._require_ready()
        session_id = new_session_id()
        spec = body.model_dump()
        payload = {
            "id": session_id,
            "mesh": {
                "axes": plan["axes"],
                "device_grid": plan["device_grid"],
                "batch_axes": _batch_axes(plan),
            },
            # The leader's budgets, so every process of a group admits alike.
            "memory_budget": self.runtime.memory_budget(),
            **spec,
        }
        # Creation initialises parameters and optimizer state: bounded like a runtime
        # start, not like a step (DATARAX_STEP_TIMEOUT_S bounds steps).
        result, _ = await self.runtime.call(
            "session_create", payload, timeout=self.settings.runtime_start_timeout_s
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
        await self.store.insert_session(session_id, mesh_id, created_at, json.dumps(record))
        return record

    async def read(self, session_id: str) -> dict[str, Any]:
        """The record with step, last loss and layouts read from the runtime's live arrays."""
        record = await self.record(session_id)
        self._require_ready()
        info, _ = await self.runtime.call("session_info", {"id": session_id})
        record.update(step=info["step"], last_loss=info["last_loss"], params=info["params"])
        return record

    async def delete(self, session_id: str) -> None:
        """Forgets the session and frees its arrays when the runtime is up."""
        if not await self.store.delete_session(session_id):
            raise SessionNotFound(f"no session with id {session_id!r}")
        if self.runtime.ready:
            try:
                await self.runtime.call("session_delete", {"id": session_id})
            except Exception:  # noqa: BLE001 (the record is gone; the runtime frees it on restart)
                pass

    async def run_steps(
        self,
        session_id: str,
        body: bytes,
        media: str | None,
        content_type: str | None,
        steps_query: int | None,
    ) -> dict[str, Any]:
        """Runs K steps; a refused request changes nothing."""
        await self.record(session_id)
        payload, arrays = await anyio.to_thread.run_sync(
            lambda: decode_step_body(body, media, content_type, steps_query, self.settings)
        )
        self._require_ready()
        result, _ = await self.runtime.call(
            "session_step",
            {"id": session_id, "memory_budget": self.runtime.memory_budget(), **payload},
            arrays,
            timeout=self.settings.step_timeout_s,
        )
        async with self._metadata_lock:
            record = await self.record(session_id)
            if result["step"] > record["step"]:
                record.update(step=result["step"], last_loss=result["losses"][-1])
                await self.store.update_session(session_id, json.dumps(record))
        return result
