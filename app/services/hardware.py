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
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
from pydantic import ValidationError

from app.core.errors import InvalidRequest, ServiceError, from_library
from app.schemas.base import optimizer_name, shards_over_data, unread_optimizer_notes
from app.schemas.hardware import HardwareMlpModel, HardwarePlanRequest, RecommendationRequest
from app.schemas.meshes import (
    MAX_PLAN_DEVICES,
    HardwarePlanBody,
    MaxTextPlanBody,
    MeshPlanRequest,
    MlpModel,
)
from app.services.answer_json import NULL
from app.services.plans import Devices, PlanRequest, RenderedPlan, plan_answer, render
from datarax.answers.catalog import HardwareEntry, HardwareList, NamedModelEntry, NamedModelList
from datarax.answers.plans import ParamLayout
from datarax.errors import PlanError
from datarax.estimate.calibrations import CalibrationProfile
from datarax.estimate.cost import estimate_step, step_warnings
from datarax.estimate.recommend import SearchSpaceTooLarge, default_axes, recommend_meshes
from datarax.estimate.results import Recommendations, StepEstimate
from datarax.hardware.chips import HARDWARE, get_hardware
from datarax.hardware.topology import (
    HardwareLayout,
    parse_tpu_topology,
    plan_hardware_devices,
)
from datarax.launch.maxtext_plan_request import plan_request_from_maxtext
from datarax.parallel.axis_roles import batch_axes, check_kinds_apply, check_named_kinds
from datarax.parallel.context import MeshContext, mesh_context
from datarax.parallel.kinds import kinds_by_alias
from datarax.parallel.options import ParallelOptions
from datarax.parallel.terms import repeat_per_device
from datarax.plan.layout import PlanCancelled, check_batch_shape
from datarax.specs.model_specs import DTYPE_BYTES, ModelSpec, TransformerSpec, model_spec
from datarax.specs.named_models import MODELS

# ------------------------------------------------------------------------------ catalog


def list_hardware() -> HardwareList:
    """``{"items": [...]}``: every catalog entry, in catalog order."""
    return HardwareList(items=list(HARDWARE.values()))


def hardware_entry(name: str) -> HardwareEntry:
    """One catalog entry.

    Raises:
      ServiceError: 404 when the catalog has no such name (the detail lists the names).
    """
    if name not in HARDWARE:
        raise ServiceError(
            f"no hardware named {name!r}; the catalog has {', '.join(HARDWARE)} (GET /v1/hardware)",
            code="hardware_not_found",
        )
    return get_hardware(name)


def list_models() -> NamedModelList:
    """``{"items": [...]}``: every named model (``GET /v1/models``)."""
    return NamedModelList(items=list(MODELS.values()))


def model_entry(name: str) -> NamedModelEntry:
    """One named model.

    Raises:
      ServiceError: 404 ``model_not_found`` (the detail lists the names).
    """
    if name not in MODELS:
        raise ServiceError(
            f"no model named {name!r}; GET /v1/models lists {', '.join(MODELS)}",
            code="model_not_found",
        )
    return MODELS[name]


# ------------------------------------------------------------------------------- plans


def hardware_plan_request(body: HardwarePlanBody | MeshPlanRequest) -> HardwarePlanRequest:
    """A ``POST /v1/meshes`` hardware-mode body as the service's hardware plan request:
    the body itself (a :class:`~app.schemas.meshes.HardwarePlanBody` is a
    :class:`HardwarePlanRequest`), nothing copied.

    Raises:
      InvalidRequest: the body is of another mode.
    """
    found = body.root if isinstance(body, MeshPlanRequest) else body
    if not isinstance(found, HardwarePlanBody):
        raise InvalidRequest("a hardware plan needs hardware and ici")
    return found


def maxtext_plan_request(
    body: MaxTextPlanBody, notes: list[str] | None = None
) -> HardwarePlanRequest:
    """The hardware plan request that MaxText's keys describe (the library's
    :func:`datarax.launch.maxtext_plan_request.plan_request_from_maxtext`), typed once;
    the body's ``name`` and ``optimizer`` (when sent) take precedence over its keys
    (ZeRO-1 where either the body's ``shard_over_data`` or MaxText's
    ``shard_optimizer_over_data`` says it). ``notes`` receives one line per MaxText key
    the plan does not read (a plan's ``warnings``).

    Raises:
      ServiceError: ``invalid_maxtext_config`` and the planner's codes.
    """
    try:
        request = plan_request_from_maxtext(
            body.maxtext,
            hardware=body.hardware,
            topology=body.topology,
            slices=body.slices if "slices" in body.model_fields_set else None,
            hosts=body.hosts,
            notes=notes,
        )
    except PlanError as error:
        raise from_library(error) from None
    if body.name is not None:
        request["name"] = body.name
    if body.calibration is not None:
        request["calibration"] = body.calibration
    if "optimizer" in body.model_fields_set:
        keys = request.get("optimizer")
        zero1 = isinstance(keys, dict) and keys.get("shard_over_data") is True
        name = optimizer_name(body.optimizer)
        zero1 = zero1 or shards_over_data(body.optimizer)
        request["optimizer"] = {"name": name, "shard_over_data": True} if zero1 else name
    try:
        return HardwarePlanRequest.model_validate(request)
    except ValidationError as error:
        raise ServiceError(
            f"the MaxText keys make a plan request that is not valid: {error.errors()[0]['msg']}",
            code="invalid_maxtext_config",
        ) from None


@dataclass(frozen=True)
class HardwarePlan:
    """A hardware plan request with what is worked out once for it, before its layout
    (the layout's facts are the library's :class:`~datarax.parallel.context.MeshContext`,
    built once after it by :func:`render_hardware_plan`).

    Attributes:
      request: the request (a hardware-mode body as parsed, or MaxText's keys typed).
      devices: the cluster's devices (``None``: malformed, the planner refuses it), at
        most :data:`~app.schemas.meshes.MAX_PLAN_DEVICES` (:func:`check_cluster_size`).
      options: the request's ``pipeline``, ``context_parallel`` and ``shard_over_data``
        (:func:`parallel_options`).
      profile: the request's ``calibration`` resolved (a stored profile read back by
        :func:`app.services.calibrations.resolve`, or without one the newest host
        profile of the hardware's devices); ``None``: the request's own.
      notes: what the plan's ``warnings`` say of the request before its layout (the
        MaxText keys it does not read).
    """

    request: HardwarePlanRequest
    devices: int | None
    options: ParallelOptions
    profile: str | CalibrationProfile | None = None
    notes: tuple[str, ...] = ()


def check_hardware_plan(request: HardwarePlanRequest) -> HardwarePlan:
    """``request`` with its cluster size checked and its options read, for
    :func:`render_hardware_plan`.

    Raises:
      ServiceError: 422 ``too_many_devices``.
    """
    return HardwarePlan(request, check_cluster_size(request), parallel_options(request))


def hardware_plan(body: HardwarePlanBody | MaxTextPlanBody) -> HardwarePlan:
    """The checked hardware plan of a hardware-mode body (its own request) or a
    MaxText-mode body (typed once from MaxText's keys).

    Raises:
      ServiceError: ``invalid_maxtext_config``, ``too_many_devices`` and the planner's
        codes of MaxText's keys.
    """
    optimizer = tuple(unread_optimizer_notes(body.optimizer))
    if isinstance(body, MaxTextPlanBody):
        notes: list[str] = []
        checked = check_hardware_plan(maxtext_plan_request(body, notes))
        return replace(checked, notes=tuple(f"maxtext: {note}" for note in notes) + optimizer)
    checked = check_hardware_plan(body)
    return replace(checked, notes=checked.notes + optimizer) if optimizer else checked


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


def parallel_options(request: HardwarePlanRequest | RecommendationRequest) -> ParallelOptions:
    """The request's ``pipeline``, ``context_parallel`` and ``shard_over_data`` as the
    library's :class:`~datarax.parallel.options.ParallelOptions`."""
    return ParallelOptions.from_json(
        None if request.pipeline is None else request.pipeline.model_dump(),
        None if request.context_parallel is None else request.context_parallel.model_dump(),
        shards_over_data(request.optimizer),
    )


def _check_options_apply(
    request: HardwarePlanRequest | RecommendationRequest, present: set[str], missing: str
) -> None:
    """Refuse a ``pipeline`` without stage axes, or a ``context_parallel`` without context
    axes, among the kinds ``present``: neither is read as anything else. ``missing``
    says where they were looked for (``{kind}`` and ``{member}`` filled in)."""
    for member, kind in (("pipeline", "stage"), ("context_parallel", "context")):
        if getattr(request, member) is not None and kind not in present:
            raise PlanError(
                "invalid_parallelism",
                f"{member} describes {kind} axes, and " + missing.format(kind=kind, member=member),
            )


def plan_model(request: HardwarePlanRequest) -> dict[str, Any]:
    """The request's ``model`` object with the sequence length its ``batch_shape`` says
    (DESIGN v1.4, "Every input is used or refused"): a transformer's ``batch_shape`` is
    ``[global sequences, sequence length]``, and its ``seq_len`` is ``batch_shape[1]``
    (a named model's own context length is only a default where a plan has no
    ``batch_shape``). An MLP's object, or one without ``batch_shape``, is as sent.

    Raises:
      PlanError: ``invalid_batch_shape`` for a transformer's ``batch_shape`` of other
        than two dimensions, a sequence length of 0, or a ``seq_len`` sent that differs
        from ``batch_shape[1]`` (the message names both).
    """
    assert request.model is not None
    model = request.model.model_dump(exclude_none=True)
    shape = request.batch_shape
    if isinstance(request.model, HardwareMlpModel | MlpModel) or shape is None:
        return model
    if len(shape) != 2:
        raise PlanError(
            "invalid_batch_shape",
            f"a transformer's batch_shape is [global sequences, sequence length]; got "
            f"{list(shape)} ({len(shape)} dimension{'s' if len(shape) != 1 else ''})",
        )
    sequences, length = int(shape[0]), int(shape[1])
    if length < 1:
        raise PlanError(
            "invalid_batch_shape",
            f"batch_shape[1] is the sequence length and must be at least 1; got {length}",
        )
    sent = model.get("seq_len")
    if sent is not None and sent != length:
        raise PlanError(
            "invalid_batch_shape",
            f"model.seq_len {sent} and batch_shape[1] {length} differ: batch_shape is "
            f"[global sequences, sequence length], so send batch_shape [{sequences}, {sent}] "
            f"for {sent}-token sequences, or leave seq_len out (it is then batch_shape[1])",
        )
    return {**model, "seq_len": length}


def _stop_if(should_stop: Callable[[], bool] | None) -> None:
    if should_stop is not None and should_stop():
        raise PlanCancelled("the plan was abandoned")


@dataclass(frozen=True)
class LaidOut:
    """A hardware plan's devices in mesh order, and its model's spec.

    Attributes:
      layout: the library's layout of the cluster (``layout.axes``: sizes resolved).
      model: the request's model as the library's spec, built once before the layout
        for its checks and then the context's (``None``: no model).
      checked_axes: the axes checked against the model before the layout (those whose
        size the request gives); the context does not check them again.
    """

    layout: HardwareLayout
    model: ModelSpec | None
    checked_axes: Mapping[str, int] = field(default_factory=dict)


def cluster_members(layout: HardwareLayout) -> dict[str, Any]:
    """The members a plan over a hardware cluster answers of its layout (hardware and
    serving plans alike): ``hardware``, ``topology`` (null for a GPU or CPU cluster, as it
    always was), ``slices``, ``hosts``, ``ici``, ``dcn``, ``axes_detail``."""
    return {
        "hardware": layout.hardware.name,
        "topology": NULL if layout.topology_name is None else layout.topology_name,
        "slices": layout.slices,
        "hosts": layout.hosts,
        "ici": layout.ici,
        "dcn": layout.dcn,
        "axes_detail": list(layout.axes_detail),
    }


def lay_out(plan: HardwarePlan) -> LaidOut:
    """The devices of the plan's cluster in mesh order (the library's planner), after the
    checks that need no layout.

    The axes whose size the request gives (``ici`` times ``dcn``, no ``-1``) are checked
    before the layout, so the planner's own refusals do not hide theirs: the kinds their
    names say (:func:`~datarax.parallel.axis_roles.check_named_kinds`), the kinds against
    the model (:func:`~datarax.parallel.axis_roles.check_kinds_apply`) and the options
    against the kinds. After the layout only the axes it sized (``-1``) are checked by
    name; the model's checks over every axis are the request's
    :class:`~datarax.parallel.context.MeshContext`'s.

    Raises:
      PlanError: ``invalid_parallelism``, ``invalid_model``, ``unknown_model`` and the
        planner's codes (``unknown_hardware``, ``invalid_topology``, ...).
    """
    request = plan.request
    dcn = request.dcn or {}
    named = {a: n * dcn.get(a, 1) for a, n in request.ici.items() if n > 0}
    check_named_kinds(named)
    spec = None
    if request.model is not None:
        spec = model_spec(plan_model(request))
        check_kinds_apply(spec, named, None, plan.options.context)
    kinds = kinds_by_alias()
    present = {kinds[a].name for a, n in named.items() if a in kinds and n > 1}
    _check_options_apply(
        request,
        present,
        "this plan has no {kind} axis over 1: add one to ici or dcn, or drop {member}",
    )
    layout = plan_hardware_devices(
        request.hardware,
        ici=request.ici,
        dcn=request.dcn,
        topology=request.topology,
        slices=request.slices,
        hosts=request.hosts,
        allow_split_physical_axes=request.allow_split_physical_axes,
    )
    sized = {a: n for a, n in layout.axes.items() if named.get(a) != n}
    if sized:
        check_named_kinds(sized)  # stage/context over 1 that a -1 became: invalid_parallelism
    return LaidOut(layout, spec, named if spec is not None else {})


def layout_devices(layout: HardwareLayout) -> Devices:
    """The plan's :class:`Devices`: JAX's ids, one process per host, and where each sits."""
    ids = layout.device_ids.astype(np.int64)
    return Devices(
        ids=ids,
        process_index=layout.host_index.astype(np.int64),
        grid=layout.device_grid,
        platform=layout.hardware.kind,
        live=False,
        slice_index=layout.slice_index,
        host_index=layout.host_index,
        physical=layout.physical,
        core=layout.core,
    )


@dataclass(frozen=True)
class StepParts:
    """What a model adds to a hardware plan, from one context and one estimate.

    Attributes:
      context: the request's :class:`~datarax.parallel.context.MeshContext` (roles,
        shard counts, parameter shardings, ``context.model`` the resolved model).
      estimate: the step estimate priced on that context.
    """

    context: MeshContext
    estimate: StepEstimate

    def params(self) -> list[ParamLayout]:
        """The plan's ``params``: every parameter group's layout and bytes per device."""
        spec = self.context.model
        itemsize = DTYPE_BYTES[getattr(spec, "param_dtype", spec.dtype)]
        stages = self.context.layer_shards
        return [
            ParamLayout(
                path=group.path,
                shape=list(group.shape),
                spec=[list(e) if isinstance(e, tuple) else e for e in entry_spec],
                shard_shape=list(shard),
                bytes_per_device=math.prod(shard) * itemsize * repeat_per_device(group, stages),
                repeat=group.repeat,
            )
            for group, entry_spec, shard, _ in self.estimate.param_shardings
        ]


def active_params(model: ModelSpec) -> int:
    """The parameters a token sees (a plan's ``active_params``): a mixture-of-experts
    model's routed experts counted ``experts_per_token`` times; every parameter of a
    dense model or an MLP."""
    if isinstance(model, TransformerSpec):
        return model.active_param_count()
    return model.param_count()


def estimate_plan(plan: HardwarePlan, laid_out: LaidOut) -> StepParts | None:
    """The plan's context and step estimate, each built once (``None`` without a model).

    Raises:
      InvalidRequest: a model without ``batch_shape``.
      PlanError: the context's and the estimate's codes (``unknown_axis_role``,
        ``tensor_not_divisible``, ``batch_not_divisible``, ``unknown_calibration``, ...).
    """
    request, layout = plan.request, laid_out.layout
    if laid_out.model is None:
        return None
    if request.batch_shape is None:
        raise InvalidRequest("a step estimate needs a model and batch_shape")
    ctx = mesh_context(
        laid_out.model,
        layout.axes,
        int(request.batch_shape[0]),
        options=plan.options,
        checked_axes=laid_out.checked_axes,
    )
    estimate = estimate_step(
        layout.hardware,
        layout.axes_detail,
        ctx.model,
        ctx.global_batch,
        optimizer=optimizer_name(request.optimizer),
        calibration=plan.profile if plan.profile is not None else request.calibration,
        context=ctx,
    )
    return StepParts(ctx, estimate)


def render_hardware_plan(
    plan: HardwarePlan,
    *,
    plan_id: str,
    created_at: str,
    should_stop: Callable[[], bool] | None = None,
    max_bytes: int | None = None,
) -> RenderedPlan:
    """A hardware plan's JSON text (abstract, over all the cluster's devices).

    ``plan`` is a request that :func:`hardware_plan` (a body) or
    :func:`check_hardware_plan` (a typed request) checked once: its cluster size and
    options are not worked out again. The model's spec, the
    :class:`~datarax.parallel.context.MeshContext` (roles, shard counts, parameter
    shardings) and the step estimate are built once each here and the answer is written
    from them.

    Adds to a plain plan's members ``hardware``, ``topology``, ``slices``, ``hosts``,
    ``ici``, ``dcn`` and ``axes_detail``; with a model ``step_estimate`` and ``model``,
    and ``memory_per_device`` and ``params`` from the step estimate (model dtype, axis
    roles); the batch then splits over the axes whose role splits it unless
    ``batch_axes`` says otherwise. Shards add ``slice``, ``host``, ``physical`` (and
    ``core`` on TPU).

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
    request = plan.request
    if request.batch_shape is not None:
        check_batch_shape(request.batch_shape)
    _stop_if(should_stop)
    laid_out = lay_out(plan)
    layout = laid_out.layout
    _stop_if(should_stop)
    devices = layout_devices(layout)
    devices.notes.extend(plan.notes)
    if layout.split_physical_axes:
        devices.notes.append("the device order splits physical axes (allow_split_physical_axes)")
    step = estimate_plan(plan, laid_out)
    if step is not None:
        devices.notes.extend(whole.warning() for whole in step.context.whole_params())
        profile = plan.profile if plan.profile is not None else request.calibration
        devices.notes.extend(step_warnings(step.context, layout.hardware, profile))
    batch = request.batch_axes
    if step is not None and batch is None:
        # what the step estimate assumes: the axes whose role splits the batch
        batch = list(batch_axes(layout.axes, step.context.roles))
    answer = plan_answer(
        PlanRequest(
            axes=layout.axes,
            batch_shape=request.batch_shape,
            batch_axes=batch,
            optimizer=optimizer_name(request.optimizer),
            name=request.name,
        ),
        layout.axes,
        devices,
        plan_id=plan_id,
        created_at=created_at,
        params=None if step is None else step.params(),
        memory=None if step is None else step.estimate.memory_per_device,
        program="maxtext",  # what launch runs: MaxText's training step (DESIGN v1.4)
        should_stop=should_stop,
        max_bytes=max_bytes,
    )
    options = plan.options
    answer = replace(
        answer,
        **cluster_members(layout),
        step_estimate=None if step is None else step.estimate,
        # the plan stores its model (resolved: a named model's figures with its overrides)
        model=None if step is None else step.context.model.to_json(),
        total_params=None if step is None else step.context.model.param_count(),
        active_params=None if step is None else active_params(step.context.model),
        # the options it echoes, as the library resolved them: pipeline and
        # context_parallel where the request sent them, shard_over_data where it is on
        pipeline=None if request.pipeline is None else asdict(options.pipeline),
        context_parallel=None if request.context_parallel is None else asdict(options.context),
        shard_over_data=True if options.shard_over_data else None,
    )
    return render(answer, should_stop)


# ------------------------------------------------------------------------ recommendations


def recommend(
    request: RecommendationRequest,
    *,
    max_search_space: int | None = None,
    should_stop: Callable[[], bool] | None = None,
    profile: str | CalibrationProfile | None = None,
) -> Recommendations:
    """``{"candidates", "considered", "rejected"}`` for the request (best first);
    ``profile`` the request's ``calibration`` resolved (else the request's own).

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
        return _recommend(request, max_search_space, should_stop, profile)
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
    profile: str | CalibrationProfile | None = None,
) -> Recommendations:
    kinds = kinds_by_alias()
    spec = model_spec(request.model.model_dump(exclude_none=True))
    named = {kinds[a].name for a in (request.axes or default_axes(spec)) if a in kinds}
    _check_options_apply(
        request, named, "the search has none: list a {kind} axis in axes, or drop {member}"
    )
    options = parallel_options(request)
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
        options=options,
        calibration=profile if profile is not None else request.calibration,
    )


__all__ = [
    "HardwarePlan",
    "LaidOut",
    "StepParts",
    "active_params",
    "check_cluster_size",
    "check_hardware_plan",
    "cluster_devices",
    "estimate_plan",
    "hardware_entry",
    "hardware_plan",
    "hardware_plan_request",
    "lay_out",
    "list_hardware",
    "list_models",
    "maxtext_plan_request",
    "model_entry",
    "parallel_options",
    "plan_model",
    "recommend",
    "render_hardware_plan",
]
