"""Hardware as a service: the catalog, hardware plans and mesh recommendations.

Plain functions over the library (:mod:`datarax.hardware.chips`, ``topology``,
``cost``, ``recommend``); no HTTP and no device here. A hardware plan is abstract
(``live: false``) over all the devices of the cluster the request names, in JAX's device
order for that hardware; its JSON is :func:`app.services.plans.render_plan`'s with
``axes_detail`` (and, with a model, ``step_estimate``) added and each shard carrying
``slice``, ``host`` and ``physical`` (``core`` on TPU).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from app.core.errors import InvalidRequest, ServiceError
from app.schemas.base import optimizer_name
from app.schemas.hardware import (
    HardwareMlpModel,
    HardwareModel,
    HardwarePlanRequest,
    RecommendationRequest,
)
from app.schemas.meshes import MAX_PLAN_DEVICES, MeshPlanRequest, MlpModel
from app.services.plans import Devices, HardwareParts, PlanRequest, RenderedPlan, render_plan
from datarax.estimate.cost import axis_roles, estimate_step, param_specs
from datarax.estimate.model_specs import DTYPE_BYTES, model_spec
from datarax.estimate.named_models import MODELS, models_json
from datarax.estimate.recommend import SearchSpaceTooLarge, recommend_meshes
from datarax.hardware.chips import HARDWARE, get_hardware
from datarax.hardware.topology import (
    HardwareLayout,
    parse_tpu_topology,
    plan_hardware_devices,
)
from datarax.parallel.axis_roles import batch_axes, check_named_kinds
from datarax.plan.layout import PlanCancelled, PlanError, check_batch_shape

# Step-estimate members DESIGN v1.1 fixes, then the library's extras worth keeping.
_ESTIMATE_KEYS = ("flops", "compute_s", "comm_s", "step_s", "mfu", "bottleneck", "collectives")
_ESTIMATE_EXTRAS = (
    "bottleneck_link",
    "phases",
    "tokens_per_device",
    "roofline_s",
    "roofline_mfu",
    "peak_flops",
    "breakdown",
    "gap",
)


# ------------------------------------------------------------------------------ catalog


def list_hardware() -> dict[str, list[dict[str, Any]]]:
    """``{"items": [...]}``: every catalog entry, in catalog order."""
    return {"items": [entry.to_json() for entry in HARDWARE.values()]}


def hardware_entry(name: str) -> dict[str, Any]:
    """One catalog entry.

    Raises:
      ServiceError: 404 when the catalog has no such name (the detail lists the names).
    """
    if name not in HARDWARE:
        raise ServiceError(
            f"no hardware named {name!r}; the catalog has {', '.join(HARDWARE)} (GET /v1/hardware)",
            code="hardware_not_found",
        )
    return get_hardware(name).to_json()


def list_models() -> dict[str, Any]:
    """``{"items": [...]}``: every named model (``GET /v1/models``)."""
    return {"items": models_json()}


def model_entry(name: str) -> dict[str, Any]:
    """One named model.

    Raises:
      ServiceError: 404 ``model_not_found`` (the detail lists the names).
    """
    if name not in MODELS:
        raise ServiceError(
            f"no model named {name!r}; GET /v1/models lists {', '.join(MODELS)}",
            code="model_not_found",
        )
    return {"name": name, **dict(MODELS[name])}


# ------------------------------------------------------------------------------- plans


def _role_batch_axes(body: MeshPlanRequest) -> list[str] | None:
    """The axes a hardware plan's batch splits over when the request names none: those
    whose role is ``data`` or ``fsdp`` (what the step estimate assumes), in mesh order;
    ``None`` (the plain default) when an axis has no role."""
    if body.model is None or body.batch_shape is None or not body.ici:
        return None
    try:
        roles = axis_roles(list(body.ici))
    except PlanError:
        return None
    return list(batch_axes(body.ici, roles))


def hardware_plan_request(body: MeshPlanRequest) -> HardwarePlanRequest:
    """A ``POST /v1/meshes`` body with ``hardware`` as a :class:`HardwarePlanRequest`.

    The body's schema has already refused the plain-plan fields (``axes``,
    ``num_devices``, ``platform``, ``param_sharding``) and required ``ici``.
    """
    model: HardwareModel | None
    if isinstance(body.model, MlpModel):
        model = HardwareMlpModel(
            kind="mlp",
            features=body.model.features,
            dtype=body.model.dtype,
            remat=body.model.remat,
            loss=body.model.loss,
        )
    else:
        model = body.model
    optimizer = optimizer_name(body.optimizer)
    if body.hardware is None or body.ici is None:  # the schema checks it; -O keeps this
        raise InvalidRequest("a hardware plan needs hardware and ici")
    return HardwarePlanRequest(
        hardware=body.hardware,
        topology=body.topology,
        slices=body.slices,
        hosts=body.hosts,
        ici=body.ici,
        dcn=body.dcn,
        allow_split_physical_axes=body.allow_split_physical_axes,
        batch_shape=body.batch_shape,
        batch_axes=body.batch_axes if body.batch_axes is not None else _role_batch_axes(body),
        model=model,
        optimizer=optimizer,
        name=body.name,
    )


def cluster_devices(request: HardwarePlanRequest | RecommendationRequest) -> int | None:
    """The devices of the request's cluster, counted without laying any out: TPU chips
    of the topology times slices, or hosts times devices per host; ``None`` when the
    request is malformed (the planner then refuses it with its own code)."""
    try:
        entry = get_hardware(request.hardware)
        if entry.kind == "tpu":
            if request.topology is None:
                return None
            _, chips = parse_tpu_topology(request.topology, entry)
            return math.prod(chips) * int(request.slices)
        if request.hosts is None:
            return None
        return int(request.hosts) * int(entry.devices_per_host)
    except PlanError:
        return None


def check_cluster_size(request: HardwarePlanRequest | RecommendationRequest) -> int | None:
    """Refuses a cluster above :data:`~app.schemas.meshes.MAX_PLAN_DEVICES` devices, the
    cap abstract plans have (``num_devices``), before anything is laid out.

    Returns:
      the cluster's device count (``None``: the planner will refuse the request).

    Raises:
      ServiceError: 422 ``too_many_devices`` with ``devices`` and ``limit``.
    """
    devices = cluster_devices(request)
    if devices is not None and devices > MAX_PLAN_DEVICES:
        what = "slices" if get_hardware(request.hardware).kind == "tpu" else "hosts"
        raise ServiceError(
            f"{request.hardware} with these {what} has {devices} devices; plans and "
            f"recommendations cover at most {MAX_PLAN_DEVICES} (the num_devices cap of "
            f"abstract plans): use fewer {what}",
            code="too_many_devices",
            extra={"devices": devices, "limit": MAX_PLAN_DEVICES},
        )
    return devices


def _stop_if(should_stop: Callable[[], bool] | None) -> None:
    if should_stop is not None and should_stop():
        raise PlanCancelled("the plan was abandoned")


def lay_out(request: HardwarePlanRequest) -> HardwareLayout:
    """The devices of the request's cluster in mesh order (the library's planner).

    Raises:
      PlanError: the planner's codes (``unknown_hardware``, ``invalid_topology``, ...).
    """
    dcn = request.dcn or {}
    # before the layout, so its own refusals do not hide this one; -1 sizes after it
    check_named_kinds({a: n * dcn.get(a, 1) for a, n in request.ici.items() if n > 0})
    layout = plan_hardware_devices(
        request.hardware,
        ici=request.ici,
        dcn=request.dcn,
        topology=request.topology,
        slices=request.slices,
        hosts=request.hosts,
        allow_split_physical_axes=request.allow_split_physical_axes,
    )
    check_named_kinds(layout.axes)  # expert/stage/context over 1: invalid_parallelism
    return layout


def layout_devices(layout: HardwareLayout) -> Devices:
    """The plan's :class:`Devices`: JAX's ids, one process per host, and where each sits."""
    ids = layout.device_ids.astype(np.int64)
    return Devices(
        ids=ids,
        process_index=layout.host_index.astype(np.int64),
        grid=layout.device_grid.tolist(),
        platform=layout.hardware.kind,
        live=False,
        slice_index=layout.slice_index,
        host_index=layout.host_index,
        physical=layout.physical,
        core=layout.core,
    )


def _step_parts(
    request: HardwarePlanRequest, layout: HardwareLayout
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """``(params, memory_per_device, step_estimate)`` of the request's model."""
    if request.model is None or request.batch_shape is None:
        raise InvalidRequest("a step estimate needs a model and batch_shape")
    spec = model_spec(request.model.model_dump(exclude_none=True))
    global_batch = int(request.batch_shape[0])
    estimate = estimate_step(
        layout.hardware,
        layout.axes_detail,
        spec,
        global_batch,
        optimizer=optimizer_name(request.optimizer),
    )
    roles = axis_roles(list(layout.axes))
    itemsize = DTYPE_BYTES[getattr(spec, "param_dtype", spec.dtype)]
    params = [
        {
            "path": group.path,
            "shape": list(group.shape),
            "spec": [list(e) if isinstance(e, tuple) else e for e in entry_spec],
            "shard_shape": list(shard),
            "bytes_per_device": math.prod(shard) * itemsize * group.repeat,
            "repeat": group.repeat,
        }
        for group, entry_spec, shard, _ in param_specs(spec, layout.axes, roles)
    ]
    step = {key: estimate[key] for key in (*_ESTIMATE_KEYS, *_ESTIMATE_EXTRAS)}
    step["model"] = spec.to_json()
    return params, dict(estimate["memory_per_device"]), step


def render_hardware_plan(
    request: HardwarePlanRequest,
    *,
    plan_id: str,
    created_at: str,
    should_stop: Callable[[], bool] | None = None,
    max_bytes: int | None = None,
) -> RenderedPlan:
    """A hardware plan's JSON text (abstract, over all the cluster's devices).

    Adds to a plain plan's members ``hardware``, ``topology``, ``slices``, ``hosts``,
    ``ici``, ``dcn`` and ``axes_detail``; with a model ``step_estimate``, and
    ``memory_per_device`` and ``params`` from the step estimate (model dtype, axis
    roles). Shards add ``slice``, ``host``, ``physical`` (and ``core`` on TPU).

    ``should_stop`` (see :func:`app.services.plans.render_plan`) is checked before and
    after the layout and while the shards are written; ``max_bytes`` refuses a plan whose
    text would pass it before the shards are written.

    Raises:
      PlanError: the planner's and the estimate's codes, and the batch codes of plain
        plans (``batch_not_divisible``, ``unknown_batch_axis``, ``invalid_batch_shape``).
      ServiceError: ``too_many_devices`` (above the abstract plans' cap),
        ``answer_too_large``.
      PlanCancelled: ``should_stop`` answered true.
    """
    check_cluster_size(request)
    if request.batch_shape is not None:
        check_batch_shape(request.batch_shape)
    _stop_if(should_stop)
    layout = lay_out(request)
    _stop_if(should_stop)
    devices = layout_devices(layout)
    if layout.split_physical_axes:
        devices.notes.append("the device order splits physical axes (allow_split_physical_axes)")
    members: dict[str, Any] = {
        "hardware": layout.hardware.name,
        "topology": layout.topology_name,
        "slices": layout.slices,
        "hosts": layout.hosts,
        "ici": layout.ici,
        "dcn": layout.dcn,
        "axes_detail": [link.to_json() for link in layout.axes_detail],
    }
    params = memory = None
    if request.model is not None:
        params, memory, members["step_estimate"] = _step_parts(request, layout)
        # the plan stores its model (resolved: a named model's figures with its overrides)
        members["model"] = members["step_estimate"].pop("model")
    plain = PlanRequest(
        axes=layout.axes,
        batch_shape=request.batch_shape,
        batch_axes=request.batch_axes,
        optimizer=optimizer_name(request.optimizer),
        name=request.name,
    )
    return render_plan(
        plain,
        layout.axes,
        devices,
        plan_id=plan_id,
        created_at=created_at,
        hardware=HardwareParts(members=members, params=params, memory=memory),
        should_stop=should_stop,
        max_bytes=max_bytes,
    )


# ------------------------------------------------------------------------ recommendations


def recommend(
    request: RecommendationRequest,
    *,
    max_search_space: int | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """``{"candidates", "considered", "rejected"}`` for the request (best first).

    Each candidate's ``plan_request`` is a ``POST /v1/meshes`` body as it is. The
    cluster is bounded like a hardware plan (``too_many_devices``) and the search space
    (ICI x DCN factorisations) is counted before any work: above ``max_search_space``
    (``DATARAX_MAX_SEARCH_SPACE``) the request is refused with the count, the limit and
    what would shrink it.

    Raises:
      PlanError: bad inputs (``unknown_hardware``, ``invalid_topology``, ...), or
        ``no_plan_fits`` with what would fit.
      ServiceError: ``too_many_devices``; ``search_space_too_large`` with members
        ``search_space``, ``limit`` and ``suggestions`` (each ``{"change", "request",
        "search_space"}``: members to change in the request, and the space it gives).
      PlanCancelled: ``should_stop`` answered true.
    """
    check_cluster_size(request)
    try:
        return _recommend(request, max_search_space, should_stop)
    except SearchSpaceTooLarge as error:
        raise ServiceError(
            error.message,
            code="search_space_too_large",
            extra={
                "search_space": error.count,
                "limit": error.limit,
                "suggestions": error.suggestions,
            },
        ) from None


def _recommend(
    request: RecommendationRequest,
    max_search_space: int | None,
    should_stop: Callable[[], bool] | None,
) -> dict[str, Any]:
    return recommend_meshes(
        request.hardware,
        model=request.model.model_dump(exclude_none=True),
        global_batch=request.global_batch,
        topology=request.topology,
        slices=request.slices,
        hosts=request.hosts,
        axes=request.axes,
        top_k=request.top_k,
        optimizer=optimizer_name(request.optimizer),
        allow_split_physical_axes=request.allow_split_physical_axes,
        fixed_ici=request.fixed_ici,
        fixed_dcn=request.fixed_dcn,
        max_search_space=max_search_space,
        max_devices=MAX_PLAN_DEVICES,
        should_stop=should_stop,
    )


__all__ = [
    "check_cluster_size",
    "cluster_devices",
    "hardware_entry",
    "list_models",
    "model_entry",
    "hardware_plan_request",
    "lay_out",
    "list_hardware",
    "recommend",
    "render_hardware_plan",
]
