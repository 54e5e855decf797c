"""Mesh plans as a service: make (live, abstract or hardware), store, list, read, delete,
draw.

Plain async functions over the store and the runtime client. A request arrives as its
mode's type (:data:`app.schemas.meshes.PlanBody`) and :func:`create_plan` sends it down
that mode's path; the arithmetic is :mod:`app.services.plans`,
:mod:`app.services.hardware` and the library's :mod:`datarax.plan.layout`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace

import anyio.to_thread
import orjson

from app.core.answer_limit import check_answer_size
from app.core.errors import (
    AnswerTooLarge,
    InvalidRequest,
    MeshNotFound,
    ServiceError,
    WorkerLost,
)
from app.core.ids import new_plan_id, utc_now
from app.schemas.base import optimizer_name, unread_optimizer_notes
from app.schemas.meshes import (
    AbstractPlanBody,
    HardwarePlanBody,
    LivePlanBody,
    MaxTextPlanBody,
    MeshPlanRequest,
    PlainPlanBody,
    PlanBody,
)
from app.schemas.serving import ServingPlanBody
from app.services import calibrations
from app.services.hardware import (
    HardwarePlan,
    cluster_devices,
    hardware_plan,
    render_hardware_plan,
)
from app.services.heavy_work import LARGE_PLAN_DEVICES, HeavyWork
from app.services.layout_svg import render_layout_svg
from app.services.plans import (
    PlanRequest,
    RenderedPlan,
    abstract_devices,
    check_plan_request,
    live_devices,
    render_plan,
)
from app.services.serving import render_serving_plan
from app.storage import plans as stored_plans
from app.storage.store import Store
from app.workers.runtime_client import RuntimeClient
from datarax.plan.layout import resolve_axes

MAX_MESH_AXES = 64
"""numpy's (and so JAX's) limit on array rank: a mesh's device grid has one dimension per axis."""


@dataclass(frozen=True)
class CreatedPlan:
    """A stored plan: its id, JSON text, and whether it is live."""

    id: str
    body: str
    live: bool


@dataclass(frozen=True)
class _Rendering:
    """Where a plan renders and what bounds its answer (see :func:`create_plan`)."""

    lane: HeavyWork | None
    client_gone: Callable[[], Awaitable[bool]] | None
    max_answer_bytes: int | None


def _plain_body(body: PlainPlanBody | MeshPlanRequest) -> PlainPlanBody:
    found = body.root if isinstance(body, MeshPlanRequest) else body
    if not isinstance(found, LivePlanBody | AbstractPlanBody):
        raise InvalidRequest("a device plan needs axes and, if any, an MLP model")
    return found


def plan_request(body: PlainPlanBody | MeshPlanRequest) -> PlanRequest:
    """What a live or abstract plan's body asks for, as the planner's :class:`PlanRequest`.

    Raises:
      InvalidRequest: the body is of another mode.
    """
    body = _plain_body(body)
    model = body.mlp
    param_sharding = body.param_sharding
    optimizer = optimizer_name(body.optimizer)
    if model is not None:
        param_sharding = model.param_sharding or param_sharding
        optimizer = optimizer_name(model.optimizer, optimizer)
    return PlanRequest(
        axes=body.axes,
        batch_shape=body.batch_shape,
        batch_axes=body.batch_axes,
        features=None if model is None else model.features,
        param_sharding=param_sharding,
        optimizer=optimizer,
        name=body.name,
    )


def _check_axis_count(axes: Mapping[str, int]) -> None:
    if len(axes) > MAX_MESH_AXES:
        raise ServiceError(
            f"the mesh has {len(axes)} axes; at most {MAX_MESH_AXES} are possible "
            "(a device grid is an array of that rank); merge axes of size 1",
            code="too_many_axes",
        )


async def _render(
    work: Callable[[Callable[[], bool] | None], RenderedPlan],
    devices: int | None,
    rendering: _Rendering,
) -> RenderedPlan:
    """Renders on the heavy lane when the plan is large (more than
    :data:`~app.services.heavy_work.LARGE_PLAN_DEVICES` devices), else on a plain thread."""
    lane = rendering.lane
    if lane is not None and devices is not None and devices > LARGE_PLAN_DEVICES:
        return await lane.run(f"plan of {devices} devices", work, rendering.client_gone)
    return await anyio.to_thread.run_sync(lambda: work(None))


async def _store(
    store: Store,
    plan_id: str,
    created_at: str,
    name: str | None,
    rendered: RenderedPlan,
    *,
    live: bool,
) -> CreatedPlan:
    check_answer_size(len(rendered.body), "the plan")  # refused: nothing stored
    await stored_plans.insert_plan(
        store, plan_id, created_at, name, live, rendered.body, rendered.summary
    )
    return CreatedPlan(id=plan_id, body=rendered.body, live=live)


async def create_plan(
    body: PlanBody | MeshPlanRequest,
    store: Store,
    runtime: RuntimeClient,
    *,
    lane: HeavyWork | None = None,
    client_gone: Callable[[], Awaitable[bool]] | None = None,
    max_answer_bytes: int | None = None,
) -> CreatedPlan:
    """Plans a mesh and stores it durably: each mode down its own path.

    Plans over ``LARGE_PLAN_DEVICES`` devices render on ``lane`` (the heavy lane: bounded,
    abandoned when ``client_gone`` answers true); ``max_answer_bytes`` refuses a plan
    whose text would pass it before it is written.

    - :class:`~app.schemas.meshes.HardwarePlanBody` and
      :class:`~app.schemas.meshes.MaxTextPlanBody`: an abstract plan over all the
      devices of that cluster, in JAX's order for the hardware
      (:mod:`app.services.hardware`);
    - :class:`~app.schemas.meshes.AbstractPlanBody`: ``num_devices`` devices, none
      touched;
    - :class:`~app.schemas.meshes.LivePlanBody`: the runtime's devices (their ids in
      JAX's mesh order from the ``mesh_grid`` command); the request is checked before it
      waits behind device work.

    Raises:
      PlanError: the library's plan codes.
      WorkerLost: a live plan while the runtime is not ready.
      ServiceError: ``too_many_axes``, ``too_many_devices``, ``invalid_maxtext_config``,
        ``answer_too_large``, and the heavy lane's ``busy``, ``request_abandoned``,
        ``shutting_down``.
    """
    request = body.root if isinstance(body, MeshPlanRequest) else body
    rendering = _Rendering(lane, client_gone, max_answer_bytes)
    if isinstance(request, HardwarePlanBody):
        _check_axis_count(request.ici)
        return await _create_hardware_plan(hardware_plan(request), store, rendering)
    if isinstance(request, MaxTextPlanBody):
        plan = hardware_plan(request)
        _check_axis_count(plan.request.ici)
        return await _create_hardware_plan(plan, store, rendering)
    if isinstance(request, ServingPlanBody):
        _check_axis_count(request.ici)
        return await _create_serving_plan(request, store, rendering)
    _check_axis_count(request.axes)
    if isinstance(request, AbstractPlanBody):
        return await _create_abstract_plan(request, store, rendering)
    return await _create_live_plan(request, store, runtime, rendering)


async def _create_hardware_plan(
    plan: HardwarePlan, store: Store, rendering: _Rendering
) -> CreatedPlan:
    """A hardware plan (its cluster size already checked, before it waits for a slot);
    a stored calibration profile it names, or the newest host profile of its devices, is
    read back first."""
    profile = await calibrations.resolve(store, plan.request.calibration, plan.request.hardware)
    if profile is not None:
        plan = replace(plan, profile=profile)
    plan_id, created_at = new_plan_id(), utc_now()
    rendered = await _render(
        lambda stop: render_hardware_plan(
            plan,
            plan_id=plan_id,
            created_at=created_at,
            should_stop=stop,
            max_bytes=rendering.max_answer_bytes,
        ),
        plan.devices,
        rendering,
    )
    return await _store(store, plan_id, created_at, plan.request.name, rendered, live=False)


async def _create_serving_plan(
    body: ServingPlanBody, store: Store, rendering: _Rendering
) -> CreatedPlan:
    """A serving plan (:func:`app.services.serving.render_serving_plan`), stored like a
    hardware plan."""
    plan_id, created_at = new_plan_id(), utc_now()
    rendered = await _render(
        lambda stop: render_serving_plan(
            body,
            plan_id=plan_id,
            created_at=created_at,
            should_stop=stop,
            max_bytes=rendering.max_answer_bytes,
        ),
        cluster_devices(body),  # type: ignore[arg-type]  # the same cluster members
        rendering,
    )
    return await _store(store, plan_id, created_at, body.name, rendered, live=False)


async def _create_abstract_plan(
    body: AbstractPlanBody, store: Store, rendering: _Rendering
) -> CreatedPlan:
    """An abstract plan: devices ``0..n-1``, built with the plan off the event loop."""
    request = plan_request(body)
    plan_id, created_at = new_plan_id(), utc_now()
    axes = resolve_axes(request.axes, body.num_devices, exact=True)
    devices = abstract_devices(axes, body.platform)
    devices.notes.extend(unread_optimizer_notes(body.optimizer))
    rendered = await _render(
        lambda stop: render_plan(
            request,
            axes,
            devices,
            plan_id=plan_id,
            created_at=created_at,
            should_stop=stop,
            max_bytes=rendering.max_answer_bytes,
        ),
        math.prod(axes.values()),
        rendering,
    )
    return await _store(store, plan_id, created_at, body.name, rendered, live=False)


async def _create_live_plan(
    body: LivePlanBody, store: Store, runtime: RuntimeClient, rendering: _Rendering
) -> CreatedPlan:
    """A live plan on the runtime's devices, checked before it waits behind device work."""
    request = plan_request(body)
    plan_id, created_at = new_plan_id(), utc_now()
    info = runtime.device_info()
    if info is None:
        raise WorkerLost(
            "the device runtime is not ready, so a live plan cannot be made now; retry "
            "shortly, or send num_devices for an abstract plan"
        )
    available = len(info["devices"])
    axes = resolve_axes(request.axes, available, exact=False)
    check_plan_request(request, axes)
    answer, _ = await runtime.call("mesh_grid", {"axes": axes})
    devices = live_devices(axes, answer, available)
    devices.notes.extend(unread_optimizer_notes(body.optimizer))
    rendered = await _render(
        lambda stop: render_plan(
            request,
            axes,
            devices,
            plan_id=plan_id,
            created_at=created_at,
            should_stop=stop,
            max_bytes=rendering.max_answer_bytes,
        ),
        math.prod(axes.values()),
        rendering,
    )
    return await _store(store, plan_id, created_at, body.name, rendered, live=True)


async def list_plans(
    store: Store, limit: int, offset: int, *, summary: bool, max_bytes: int
) -> bytes:
    """``{"items": [...], "total": n}`` as encoded JSON, newest first.

    Rows are read one by one and the page refused as soon as its plans pass
    ``max_bytes``, so memory stays near ``max_bytes`` whatever the plans' sizes.

    Raises:
      AnswerTooLarge: the page's plans add up to more than ``max_bytes``.
    """
    bodies, total = await stored_plans.list_plans(
        store, limit, offset, summary=summary, max_bytes=max_bytes
    )
    if bodies is None:
        raise AnswerTooLarge(
            f"these {limit} plans in full pass the answer limit of {max_bytes} bytes "
            "(DATARAX_MAX_ANSWER_MB); ask for view=summary (the default), a smaller limit, "
            "or read large plans one by one at /v1/meshes/{id}"
        )
    # Up to DATARAX_MAX_ANSWER_MB of text: joined and encoded off the event loop.
    return await anyio.to_thread.run_sync(
        lambda: ('{"items":[' + ",".join(bodies) + '],"total":' + str(total) + "}").encode()
    )


async def get_plan(store: Store, mesh_id: str) -> str:
    """The stored plan's JSON text, exactly as answered when it was made.

    Raises:
      MeshNotFound: no plan with that id.
    """
    return _found(await stored_plans.get_plan(store, mesh_id), mesh_id)


async def get_plan_stored(store: Store, mesh_id: str) -> str | bytes:
    """The stored plan as stored: its JSON text, or a zlib stream of it (large plans).

    Raises:
      MeshNotFound: no plan with that id.
    """
    found = await stored_plans.get_plan_stored(store, mesh_id)
    if found is None:
        raise MeshNotFound(f"no mesh plan with id {mesh_id!r}; list plans at /v1/meshes")
    return found


def _found(text: str | None, mesh_id: str) -> str:
    if text is None:
        raise MeshNotFound(f"no mesh plan with id {mesh_id!r}; list plans at /v1/meshes")
    return text


async def delete_plan(store: Store, mesh_id: str) -> None:
    """Forgets a plan. Raises MeshNotFound when there is none."""
    if not await stored_plans.delete_plan(store, mesh_id):
        raise MeshNotFound(f"no mesh plan with id {mesh_id!r}")
    for key in [k for k in _SVG_CACHE if k.startswith(mesh_id + "?")]:
        _SVG_CACHE.pop(key, None)


_SVG_CACHE: OrderedDict[str, str] = OrderedDict()
_SVG_CACHE_ENTRIES = 32
"""Pictures kept per process: a stored plan never changes, and drawing a 65,536-device
plan costs ~0.5 s (parse ~0.3 s, draw ~0.15 s per scope) against ~0.2 MB per kept picture."""


async def get_plan_summary(store: Store, mesh_id: str) -> str:
    """The stored plan's summary: every member but ``device_grid`` and ``shards`` (~1 KB
    where the full 65,536-device plan is ~12 MB; what the dashboard's plan page reads).

    Raises:
      MeshNotFound: no plan with that id.
    """
    return _found(await stored_plans.get_plan_summary(store, mesh_id), mesh_id)


async def layout_svg(
    store: Store, mesh_id: str, scope: dict[str, tuple[int, int]] | None = None
) -> str:
    """The plan's layout picture (SVG text) of ``scope`` (see
    :func:`app.services.layout_scope.parse_scope`; None: every device), drawn off the event
    loop once per plan and scope (plans are immutable; the last ``_SVG_CACHE_ENTRIES``
    pictures are kept)."""
    key = mesh_id + "?" + repr(sorted((scope or {}).items()))
    cached = _SVG_CACHE.get(key)
    if cached is not None:
        _SVG_CACHE.move_to_end(key)
        return cached
    text = await get_plan(store, mesh_id)
    svg = await anyio.to_thread.run_sync(lambda: render_layout_svg(orjson.loads(text), scope))
    _SVG_CACHE[key] = svg
    while len(_SVG_CACHE) > _SVG_CACHE_ENTRIES:
        _SVG_CACHE.popitem(last=False)
    return svg
