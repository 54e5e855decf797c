"""Training sessions as a service: place the built-in MLP on a live plan and run steps.

Parameters live in the runtime process; the store keeps each session's metadata (spec,
step count, last loss, layouts, a loss history of at most 2,000 evenly spaced steps).
After a runtime restart the parameters are gone and the session answers 410
``session_lost`` (its metadata stays readable in the store until it is deleted). Device
work is serialised FIFO in the runtime: steps of one session never interleave, and
concurrent calls on one session add up (N calls of k steps end at N*k).

Caps for a shared host: at most ``DATARAX_MAX_SESSIONS`` live sessions (more: 429
``too_many_sessions``), and a session without a step for ``DATARAX_SESSION_IDLE_S`` is
freed in the runtime and answers 410 ``session_expired`` (reads do not keep it alive: an
unauthenticated reader must not pin device memory). The runtime hands a deleted
session's memory back to the OS (``app.runtime.sessions.release_freed_memory``).

Deleting a session answers at once: its steps still queued for the runtime are cancelled
(their calls answer 404 ``session_not_found``), a step already running finishes, and the
runtime frees the arrays when it reaches the free. Deleting a mesh plan deletes its
sessions the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Mapping
from typing import Any

from app.codecs.json_arrays import decode_json_arrays, parse_json_model
from app.codecs.media import NPZ_MEDIA_TYPE, is_json_media
from app.codecs.npz import load_npz
from app.core.errors import (
    InvalidNpz,
    InvalidParameter,
    MeshNotFound,
    PlanNotLive,
    SessionExpired,
    SessionLost,
    SessionNotFound,
    TooManySessions,
    UnsupportedMediaType,
    WorkerLost,
    from_library,
)
from app.core.ids import new_session_id, utc_now
from app.core.settings import Settings
from app.core.telemetry import Telemetry
from app.core.threads import thread_for_body
from app.schemas.sessions import GenerateRequest, SessionCreateRequest, StepRequest
from app.services.layout_cells import plural
from app.storage import owners
from app.storage import plans as stored_plans
from app.storage import sessions as stored_sessions
from app.storage.store import Store
from app.workers.runtime_client import RuntimeClient
from datarax.answers.sessions import (
    GeneratedTokens,
    Session,
    SessionList,
    SessionParam,
    SessionSummary,
    StepAnswer,
)
from datarax.errors import PlanError
from datarax.parallel.axis_roles import check_kinds_apply
from datarax.parallel.kinds import check_compiled, kinds_of
from datarax.specs.model_specs import ModelSpec, model_spec

log = logging.getLogger("datarax.app")

BATCH_FIELDS = ("inputs", "targets")
MAX_LIST_LIMIT = 100
"""Sessions per page of ``GET /v1/sessions`` at most."""


def finite_or_none(value: Any) -> float | None:
    """A loss as JSON can hold it: non-finite (NaN, a diverging run) is None."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


LOSS_HISTORY_MAX = 2000
"""Points of a session's loss history at most. Past it, every other point is dropped and
the stride doubles, so a 1,000,000-step session keeps between 1,000 and 2,000 points (under
80 KB of its record) whatever its length."""


def extend_loss_history(
    history: list[list[Any]], stride: int, first_step: int, losses: list[Any]
) -> tuple[list[list[Any]], int]:
    """``history`` ([[step, loss], ...] by step, every step a multiple of ``stride``) with
    the losses of steps ``first_step``, ``first_step + 1``, ... added; answers the new
    history and stride.

    Only steps that are multiples of the stride are kept, so the points stay evenly spaced;
    while there are more than :data:`LOSS_HISTORY_MAX`, the stride doubles and every other
    point goes. Non-finite losses are None. Calls may arrive out of order (concurrent steps
    of one session): points are merged by step, and a step already held keeps its loss.
    """
    points = {int(step): loss for step, loss in history}
    for offset, loss in enumerate(losses):
        step = first_step + offset
        if step % stride == 0 and step not in points:
            points[step] = finite_or_none(loss)
    while len(points) > LOSS_HISTORY_MAX:
        stride *= 2
        points = {step: loss for step, loss in points.items() if step % stride == 0}
    return [[step, points[step]] for step in sorted(points)], stride


def _batch_axes(plan: dict[str, Any]) -> list[str] | None:
    """The plan's batch axes (dimension 0 of its batch spec), or None for the default."""
    batch = plan.get("batch")
    if not batch:
        return None
    first = batch["spec"][0]
    if first is None:
        return []
    return list(first) if isinstance(first, list) else [first]


def _check_kinds(model: ModelSpec, axes: Mapping[str, int]) -> None:
    """Refuse, before anything is placed, what a plan of the same model and axes refuses
    and what the library's program does not build: an axis of a kind the model gives
    nothing to split (an expert axis on a dense model or over experts it does not divide,
    stages the layers do not divide, a context or sequence axis the sequence does not
    divide) or of a kind the program leaves out (``sequence``). The axes' kinds are the
    registry's, by name; names no kind claims are the plan's own and pass.

    Raises:
      PlanError: ``invalid_parallelism``.
    """
    kinds = kinds_of(axes)
    named = {name: int(axes[name]) for name in kinds}
    check_compiled(named, {name: kind.name for name, kind in kinds.items()})
    check_kinds_apply(model, named)


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
        batch, synthetic = parsed.batch, parsed.synthetic
        if synthetic is not None and batch is None:
            return {"steps": steps, "synthetic": synthetic.model_dump()}, {}
        if batch is None or synthetic is not None:
            raise InvalidParameter(
                ("body",), "send exactly one of 'batch' (inputs and targets) or 'synthetic'"
            )
        raw = {"inputs": batch.inputs}
        if batch.targets is not None:
            raw["targets"] = batch.targets
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

    def __init__(
        self,
        store: Store,
        runtime: RuntimeClient,
        settings: Settings,
        telemetry: Telemetry | None = None,
    ):
        self.store = store
        self.runtime = runtime
        self.settings = settings
        # Steps and compile seconds are counted from the runtime's own replies, and each
        # live session's reservation kept from its creation reply: /metrics reads them
        # without a runtime round trip (see app/core/telemetry.py).
        self.telemetry = telemetry
        self._reserved: dict[str, dict[str, int]] = {}
        self._metadata_lock = asyncio.Lock()
        # session id -> the runtime's restart count when it was created: its arrays live
        # in that runtime only, so reads know it is lost without asking the runtime.
        self._epochs: dict[str, int] = {}
        # Live sessions' last creation or step (monotonic), steps in flight, and the
        # sessions freed for idleness (until deleted).
        self._last_used: dict[str, float] = {}
        self._in_flight: dict[str, int] = {}
        self._expired: set[str] = set()
        self._creating = 0
        self._admission = asyncio.Lock()
        # each session's step calls waiting on the runtime: a delete cancels them
        self._waiting: dict[str, set[asyncio.Future[Any]]] = {}
        # runtime frees of deleted sessions, run after the delete has answered
        self._freeing: set[asyncio.Task[None]] = set()

    def _forget_lost(self) -> None:
        """Drops sessions of a runtime that has restarted since: they hold no memory."""
        for sid in [s for s, epoch in self._epochs.items() if epoch != self.runtime.restarts]:
            self._epochs.pop(sid, None)
            self._last_used.pop(sid, None)

    def live_count(self) -> int:
        """Sessions whose arrays the current runtime holds (or is placing)."""
        self._forget_lost()
        return len(self._epochs) + self._creating

    def memory_reserved(self) -> dict[str, int]:
        """Bytes the live sessions reserve, by memory pool (``host:0``, ``device:3``), as
        the runtime's admission counted them at creation."""
        self._forget_lost()
        totals: dict[str, int] = {}
        for sid in list(self._reserved):
            if sid not in self._epochs:
                del self._reserved[sid]  # deleted, expired or lost: its memory is free
                continue
            for pool, size in self._reserved[sid].items():
                totals[pool] = totals.get(pool, 0) + size
        return totals

    def state_of(self, session_id: str) -> str:
        """``live``, ``expired`` (freed for idleness) or ``lost`` (a runtime restart)."""
        if session_id in self._expired:
            return "expired"
        return "live" if self._epochs.get(session_id) == self.runtime.restarts else "lost"

    def _refuse_expired(self, session_id: str) -> None:
        if session_id in self._expired:
            raise SessionExpired(
                f"session {session_id!r} ran no step for {self.settings.session_idle_s:g} s "
                "(DATARAX_SESSION_IDLE_S) and was freed; create a new session"
            )

    async def expire_idle(self) -> list[str]:
        """Frees the sessions idle for ``DATARAX_SESSION_IDLE_S``; answers their ids."""
        idle_s = self.settings.session_idle_s
        if idle_s <= 0:
            return []
        now = time.monotonic()
        stale = [
            sid
            for sid, last in self._last_used.items()
            if now - last >= idle_s and not self._in_flight.get(sid)
        ]
        for sid in stale:
            self._last_used.pop(sid, None)
            live = self._epochs.pop(sid, None) == self.runtime.restarts
            if not live:
                continue
            self._expired.add(sid)
            if self.runtime.ready:
                with contextlib.suppress(Exception):  # a restart frees it anyway
                    await self.runtime.call("session_delete", {"id": sid})
        return stale

    async def expire_idle_loop(self) -> None:
        """Runs :meth:`expire_idle` every quarter of the idle time (at most every minute)
        until cancelled; nothing when expiry is off."""
        idle_s = self.settings.session_idle_s
        if idle_s <= 0:
            return
        period = min(max(idle_s / 4, 0.05), 60.0)
        while True:
            await asyncio.sleep(period)
            try:
                await self.expire_idle()
            except Exception:  # noqa: BLE001 (next round retries; the loop must live)
                pass

    async def list_sessions(
        self, limit: int, offset: int, mesh_id: str | None = None
    ) -> SessionList:
        """The stored sessions, newest first: each summary is the record without
        ``params`` and loss history, plus ``state`` (``live``, ``expired``, ``lost``).

        Raises:
          MeshNotFound: ``mesh_id`` names no plan.
        """
        if mesh_id is not None and await stored_plans.get_plan(self.store, mesh_id) is None:
            raise MeshNotFound(f"no mesh plan with id {mesh_id!r}")
        texts, total = await stored_sessions.list_sessions(
            self.store, min(limit, MAX_LIST_LIMIT), offset, mesh_id
        )
        items = []
        for text in texts:
            record = json.loads(text)
            record["last_loss"] = finite_or_none(record.get("last_loss"))
            record["state"] = self.state_of(record["id"])
            items.append(SessionSummary.from_json(record))  # params and history left out
        return SessionList(items=items, total=total)

    def _require_ready(self) -> None:
        if not self.runtime.ready:
            raise WorkerLost("the device runtime is not ready; retry shortly")

    async def record(self, session_id: str) -> dict[str, Any]:
        """The stored record. Raises SessionNotFound."""
        text = await stored_sessions.get_session(self.store, session_id)
        if text is None:
            raise SessionNotFound(f"no session with id {session_id!r}")
        return json.loads(text)

    async def create(self, mesh_id: str, body: SessionCreateRequest) -> Session:
        """Places the model and optimizer on a live plan's devices; answers the record.

        Raises:
          MeshNotFound, PlanNotLive, WorkerLost, and the runtime's errors
          (``invalid_strategy``, ``insufficient_memory``, ...).
        """
        text = await stored_plans.get_plan(self.store, mesh_id)
        if text is None:
            raise MeshNotFound(f"no mesh plan with id {mesh_id!r}; create one with POST /v1/meshes")
        plan = json.loads(text)
        if not plan.get("live"):
            raise PlanNotLive(
                f"plan {mesh_id!r} is abstract (planned for {plan.get('total_devices')} devices "
                "without touching them); create a live plan (no num_devices) to train"
            )
        self._require_ready()
        async with self._admission:
            if self.live_count() >= self.settings.max_sessions:
                raise TooManySessions(
                    f"{plural(self.settings.max_sessions, 'session')} "
                    f"{'is' if self.settings.max_sessions == 1 else 'are'} live "
                    "(DATARAX_MAX_SESSIONS); "
                    "delete one (DELETE /v1/sessions/{id}) or wait for an idle one to expire",
                    headers={"Retry-After": "1"},
                )
            self._creating += 1
        try:
            return await self._create(mesh_id, plan, body)
        finally:
            self._creating -= 1

    async def _create(
        self, mesh_id: str, plan: dict[str, Any], body: SessionCreateRequest
    ) -> Session:
        session_id = new_session_id()
        spec = body.model_dump()
        try:
            # a transformer's unset fields take the spec's defaults (model_spec); a named
            # model is resolved once, so the record says what was trained
            resolved = model_spec(body.model.model_dump(exclude_none=True))
            _check_kinds(resolved, plan["axes"])
        except PlanError as error:
            raise from_library(error) from None
        if spec["model"].get("kind") != "mlp":
            spec["model"] = resolved.to_json()
            spec["loss"] = "next_token"
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
        session = Session(
            id=session_id,
            mesh_id=mesh_id,
            created_at=created_at,
            step=0,
            last_loss=None,
            model=spec["model"],
            optimizer=body.optimizer,
            loss=spec["loss"],
            seed=body.seed,
            param_sharding=body.param_sharding,
            strategy=body.strategy,
            params=[SessionParam.from_json(p) for p in result["params"]],
            loss_history=[],
            loss_history_stride=1,
        )
        await stored_sessions.insert_session(
            self.store, session_id, mesh_id, created_at, json.dumps(session.to_json())
        )
        self._epochs[session_id] = self.runtime.restarts
        self._last_used[session_id] = time.monotonic()
        self._reserved[session_id] = dict(result.get("reserved") or {})
        log.info("session %s created on mesh %s", session_id, mesh_id)
        return session

    async def read(self, session_id: str) -> Session:
        """The stored record: step and last loss as the last step left them, layouts as
        placed at creation (they never change).

        Served from what the HTTP process knows, never by queueing runtime work: an
        unauthenticated reader must not slow an authorised trainer's steps.

        Raises:
          SessionNotFound; WorkerLost while the runtime is down; SessionLost when the
          runtime that held the session has restarted since (or this process has).
        """
        record = await self.record(session_id)
        self._refuse_expired(session_id)
        self._require_ready()
        await self._refuse_lost(session_id)
        record["last_loss"] = finite_or_none(record.get("last_loss"))
        record.setdefault("loss_history", [])  # records made before loss histories
        record.setdefault("loss_history_stride", 1)
        return Session.from_json(record)

    async def _refuse_lost(self, session_id: str) -> None:
        """410 ``session_lost`` unless this process's current runtime holds the session,
        saying where it is: on another live replica (by its owner key), else gone."""
        if self._epochs.get(session_id) == self.runtime.restarts:
            return
        owner = await stored_sessions.held_elsewhere(self.store, session_id)
        if owner is not None:
            raise SessionLost(
                f"session {session_id!r} lives on replica {owner} of this service (its "
                "owner key in the shared PostgreSQL database's work_owners table; this "
                f"replica is {owners.OWNER}), whose runtime holds its parameters: send the "
                "session's requests to that replica (a load balancer with session affinity "
                "does)"
            )
        raise SessionLost(
            f"session {session_id!r} is not held by this replica's runtime: the runtime "
            "(or the service) has restarted since it was created, or the replica that "
            "created it has stopped; its parameters are gone: create a new session"
        )

    async def delete(self, session_id: str) -> None:
        """Forgets the session, cancels its steps still queued for the runtime (their calls
        answer 404 ``session_not_found`` at once; a step already running finishes), and
        answers without waiting: the runtime frees the arrays when it reaches the free,
        after the command it is running."""
        if not await stored_sessions.delete_session(self.store, session_id):
            raise SessionNotFound(f"no session with id {session_id!r}")
        self._epochs.pop(session_id, None)
        self._last_used.pop(session_id, None)
        for call in self._waiting.pop(session_id, set()):
            call.cancel()  # queued: never sent; running: the runtime finishes it
        if session_id in self._expired:  # freed already
            self._expired.discard(session_id)
            return
        if self.runtime.ready:
            task = asyncio.create_task(self._free(session_id), name=f"free-{session_id}")
            self._freeing.add(task)
            task.add_done_callback(self._freeing.discard)

    async def settle(self) -> None:
        """Returns once the runtime frees of deleted sessions have been sent and answered
        (tests, and a shutdown that wants them done)."""
        while self._freeing:
            await asyncio.wait(set(self._freeing))

    async def _free(self, session_id: str) -> None:
        try:
            await self.runtime.call("session_delete", {"id": session_id})
        except Exception:  # noqa: BLE001 (the record is gone; the runtime frees it on restart)
            pass

    async def delete_mesh_sessions(self, mesh_id: str) -> list[str]:
        """Deletes every session of a mesh plan (``DELETE /v1/meshes/{id}`` ends them, as
        :meth:`delete` ends one); answers their ids."""
        texts, _ = await stored_sessions.list_sessions(self.store, 1_000_000, 0, mesh_id)
        ended = []
        for text in texts:
            session_id = json.loads(text)["id"]
            with contextlib.suppress(SessionNotFound):  # deleted meanwhile
                await self.delete(session_id)
                ended.append(session_id)
        return ended

    async def generate(self, session_id: str, body: GenerateRequest) -> GeneratedTokens:
        """Greedy tokens from a transformer session's parameters as they are now (the
        runtime's ``session_generate``); bounded like a step (``DATARAX_STEP_TIMEOUT_S``).

        Raises:
          SessionNotFound, SessionExpired, SessionLost, WorkerLost; InvalidParameter
          (``validation_error``): an MLP session, prompt rows of different lengths or
          over 512 ids, an id not below the model's vocab.
        """
        record = await self.record(session_id)
        self._refuse_expired(session_id)
        model = record.get("model") or {}
        if model.get("kind") == "mlp":
            raise InvalidParameter(
                ["body"], "generate takes a transformer session; this one is an MLP"
            )
        lengths = {len(row) for row in body.prompt}
        if len(lengths) != 1 or not 1 <= lengths.pop() <= 512:
            raise InvalidParameter(
                ["body", "prompt"], "prompt rows must be of one length, 1 to 512 ids"
            )
        vocab = int(model.get("vocab") or 0)
        if vocab and max(max(row) for row in body.prompt) >= vocab:
            raise InvalidParameter(
                ["body", "prompt"], f"token ids must be below the model's vocab {vocab}"
            )
        self._require_ready()
        await self._refuse_lost(session_id)
        result, _ = await self.runtime.call(
            "session_generate",
            {"id": session_id, "prompt": body.prompt, "steps": body.steps},
            timeout=self.settings.step_timeout_s,
        )
        if session_id in self._last_used:
            self._last_used[session_id] = time.monotonic()
        return GeneratedTokens.from_json(result)

    async def run_steps(
        self,
        session_id: str,
        body: bytes,
        media: str | None,
        content_type: str | None,
        steps_query: int | None,
    ) -> StepAnswer:
        """Runs K steps; a refused request changes nothing. The answer is the runtime's,
        read at this edge."""
        await self.record(session_id)
        self._refuse_expired(session_id)
        self._in_flight[session_id] = self._in_flight.get(session_id, 0) + 1
        try:
            payload, arrays = await thread_for_body(
                lambda: decode_step_body(body, media, content_type, steps_query, self.settings),
                len(body),
            )
            self._require_ready()
            await self._refuse_lost(session_id)
            call = asyncio.ensure_future(
                self.runtime.call(
                    "session_step",
                    {"id": session_id, "memory_budget": self.runtime.memory_budget(), **payload},
                    arrays,
                    timeout=self.settings.step_timeout_s,
                )
            )
            waiting = self._waiting.setdefault(session_id, set())
            waiting.add(call)
            try:
                result, _ = await call
            except asyncio.CancelledError:
                this = asyncio.current_task()
                if this is not None and this.cancelling():
                    raise  # this request itself was cancelled (its client went away)
                raise SessionNotFound(
                    f"session {session_id!r} was deleted while this call waited; no step ran"
                ) from None
            finally:
                waiting.discard(call)
                if not waiting and self._waiting.get(session_id) is waiting:
                    del self._waiting[session_id]
        finally:
            self._in_flight[session_id] -= 1
            if not self._in_flight[session_id]:
                del self._in_flight[session_id]
            if session_id in self._last_used:
                self._last_used[session_id] = time.monotonic()
        if self.telemetry is not None:
            timing = result.get("timing") or {}
            self.telemetry.count_steps(
                payload["steps"], None if timing.get("cache_hit") else timing.get("compile_s")
            )
        async with self._metadata_lock:
            record = await self.record(session_id)
            losses = result["losses"]
            history, stride = extend_loss_history(
                record.get("loss_history") or [],
                record.get("loss_history_stride", 1),
                result["step"] - len(losses) + 1,
                losses,
            )
            record.update(loss_history=history, loss_history_stride=stride)
            if result["step"] > record["step"]:
                record.update(step=result["step"], last_loss=finite_or_none(losses[-1]))
            await stored_sessions.update_session(self.store, session_id, json.dumps(record))
        return StepAnswer.from_json(result)
