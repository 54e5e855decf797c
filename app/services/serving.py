"""Serving plans and serving recommendations as a service (DESIGN v1.4, "Serving plans").

Plain functions over the library (:mod:`datarax.estimate.serving`,
:mod:`datarax.estimate.serving_recommend`); no HTTP here. A serving plan is a hardware
plan's answer (all the cluster's devices in JAX's order, ``axes_detail``, the resolved
``model``) with the deployment's ``serving_estimate``, its ``serving`` options and its
serving ``memory_per_device`` in place of a training step's; it is stored like any plan
(:func:`app.services.meshes.create_plan`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from app.schemas.serving import ServingPlanBody, ServingRecommendationRequest
from app.services.hardware import (
    active_params,
    check_cluster_size,
    cluster_members,
    layout_devices,
)
from app.services.plans import PlanRequest, RenderedPlan, plan_answer, render
from datarax.answers.serving import ServingRecommendations
from datarax.estimate.serving import estimate_serving
from datarax.estimate.serving_memory import ServingOptions
from datarax.estimate.serving_recommend import recommend_serving
from datarax.hardware.topology import plan_hardware_devices
from datarax.plan.layout import PlanCancelled
from datarax.specs.model_specs import model_spec

__all__ = ["recommend", "render_serving_plan", "serving_options"]


def serving_options(body: ServingPlanBody | ServingRecommendationRequest) -> ServingOptions:
    """The body's ``serving`` as the library's options (checked again there)."""
    return ServingOptions.from_json(body.serving.model_dump(exclude_none=True))


def _stop_if(should_stop: Callable[[], bool] | None) -> None:
    if should_stop is not None and should_stop():
        raise PlanCancelled("the plan was abandoned")


def render_serving_plan(
    body: ServingPlanBody,
    *,
    plan_id: str,
    created_at: str,
    should_stop: Callable[[], bool] | None = None,
    max_bytes: int | None = None,
) -> RenderedPlan:
    """A serving plan's JSON text: the cluster laid out, the deployment priced.

    Raises:
      PlanError: the planner's codes (``unknown_hardware``, ``invalid_topology``, ...),
        ``invalid_model``, ``invalid_serving``, ``unknown_axis_role``,
        ``invalid_parallelism`` (fsdp, context or sequence axes; an expert axis on a dense
        model), ``tensor_not_divisible``, ``unknown_calibration``,
        ``invalid_calibration``.
      ServiceError: ``too_many_devices``, ``answer_too_large``.
      PlanCancelled: ``should_stop`` answered true.
    """
    check_cluster_size(body)  # type: ignore[arg-type]  # the same cluster members
    options = serving_options(body)
    spec = model_spec(body.model.model_dump(exclude_none=True))
    _stop_if(should_stop)
    layout = plan_hardware_devices(
        body.hardware,
        ici=body.ici,
        dcn=body.dcn,
        topology=body.topology,
        slices=body.slices,
        hosts=body.hosts,
        allow_split_physical_axes=body.allow_split_physical_axes,
    )
    _stop_if(should_stop)
    plan = estimate_serving(
        layout.hardware, layout.axes_detail, spec, options, calibration=body.calibration
    )
    devices = layout_devices(layout)
    if layout.split_physical_axes:
        devices.notes.append("the device order splits physical axes (allow_split_physical_axes)")
    if not plan.memory_per_device.fits:
        devices.notes.append(
            f"the weights ({plan.memory_per_device.weights} bytes a device) and activations "
            f"leave room for {plan.serving_estimate.kv_capacity_tokens} cached tokens a "
            f"replica, fewer than one sequence of {options.model_len} tokens: use more "
            "tensor or stage devices, or a smaller weight_dtype"
        )
    answer = plan_answer(
        PlanRequest(axes=layout.axes, name=body.name),
        layout.axes,
        devices,
        plan_id=plan_id,
        created_at=created_at,
        should_stop=should_stop,
        max_bytes=max_bytes,
    )
    answer = replace(
        answer,
        **cluster_members(layout),
        memory_per_device=plan.memory_per_device,
        model=plan.model.to_json(),
        total_params=plan.model.param_count(),
        active_params=active_params(plan.model),
        serving_estimate=plan.serving_estimate,
        serving=plan.options.to_json(),
    )
    return render(answer, should_stop)


def recommend(
    body: ServingRecommendationRequest, *, should_stop: Callable[[], bool] | None = None
) -> ServingRecommendations:
    """The serving layouts of the body's cluster, best first
    (:func:`~datarax.estimate.serving_recommend.recommend_serving`).

    Raises:
      PlanError: ``invalid_serving``, ``no_plan_fits``, ``search_space_too_large`` and
        the planner's cluster codes.
      ServiceError: ``too_many_devices``.
      PlanCancelled: ``should_stop`` answered true.
    """
    check_cluster_size(body)  # type: ignore[arg-type]  # the same cluster members
    return recommend_serving(
        body.hardware,
        model=body.model.model_dump(exclude_none=True),
        serving=serving_options(body),
        slo=None if body.slo is None else body.slo.model_dump(exclude_none=True),
        topology=body.topology,
        slices=body.slices,
        hosts=body.hosts,
        top_k=body.top_k,
        calibration=body.calibration,
        should_stop=should_stop,
    )
