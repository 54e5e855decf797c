"""Serving recommendations (DESIGN v1.4, "Serving plans"): every tensor, expert, stage and
replica split of a cluster, priced by :func:`datarax.estimate.serving.estimate_serving`,
ranked by output tokens per second per device among the layouts that fit and meet the
request's ``slo``; every rejected layout is answered with why.

The layouts: the devices of one TPU slice or NVLink domain (``ici``) factorised over the
axes ``data``, ``stage``, ``expert`` (models with experts only) and ``tensor``, in that
mesh order (tensor innermost, on the nearest devices); the slices or domains (``dcn``)
over ``data`` and ``stage`` only (a tensor or expert axis across the slow network would
put collectives inside every layer on it). Each ``ici`` factorisation is laid out once on
one slice (:func:`datarax.hardware.topology.plan_hardware_devices`, JAX's device order;
what JAX refuses is rejected with its code).

Example:
  >>> out = recommend_serving("tpu-v5e", topology="2x4", model={"name": "llama2-7b"},
  ...                         serving={"input_tokens": 1000, "output_tokens": 200},
  ...                         slo={"tpot_s": 0.05}, top_k=1)
  >>> best = out.candidates[0]
  >>> best.memory_per_device.fits, best.serving_estimate.tpot_s <= 0.05
  (True, True)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from datarax.answers.calibrations import CalibrationProfile
from datarax.answers.serving import (
    ServingCandidate,
    ServingRecommendations,
    ServingRejection,
)
from datarax.errors import PlanError
from datarax.estimate.factorisations import count_factorisations, factorisations
from datarax.estimate.recommend import dcn_links
from datarax.estimate.serving import ServingPlan, estimate_serving
from datarax.estimate.serving_memory import ServingOptions
from datarax.estimate.serving_profiles import serving_profile
from datarax.hardware.chips import AxisLink, Hardware, get_hardware
from datarax.hardware.topology import plan_hardware_devices
from datarax.plan.layout import PlanCancelled
from datarax.specs.model_specs import TransformerSpec, model_spec

__all__ = ["MAX_SERVING_LAYOUTS", "SERVING_RANKING", "recommend_serving"]

MAX_SERVING_LAYOUTS = 20_000
"""Most layouts one serving recommendation prices (``search_space_too_large`` beyond)."""

SERVING_RANKING = (
    "serving_estimate.output_tokens_per_s_per_device (output tokens per second over every "
    "device), most first, among layouts that fit and meet the slo; equal figures by the "
    "lower tpot_s, then by enumeration order"
)

_SLOW_AXES = ("data", "stage")


@dataclass(frozen=True)
class _Cluster:
    hw: Hardware
    where: Mapping[str, Any]
    n_ici: int
    n_dcn: int
    per_domain_hosts: int


def _cluster(hw: Hardware, topology: str | None, slices: int, hosts: int | None) -> _Cluster:
    """The cluster's devices per slice / domain and its slices / domains, checked by the
    planner's own codes (one slice or domain laid out)."""
    if hw.kind == "tpu":
        if (
            hosts is not None
            or isinstance(slices, bool)
            or not isinstance(slices, int)
            or slices < 1
        ):
            # the planner's own checks and messages
            plan_hardware_devices(
                hw, ici={"data": -1}, dcn={"data": -1}, topology=topology, slices=slices,
                hosts=hosts,
            )  # fmt: skip
        # one slice laid out: the cluster is its slices, whatever their number
        probe = plan_hardware_devices(hw, ici={"data": -1}, topology=topology)
        where = {"topology": topology, **({"slices": slices} if slices > 1 else {})}
        return _Cluster(hw, where, probe.num_devices, int(slices), 0)
    whole = plan_hardware_devices(hw, ici={"data": -1}, dcn={"data": -1}, hosts=hosts)
    per_host = int(hw.devices_per_host)
    per_domain = int(hw.fast_domain_devices or per_host)
    n_dcn = whole.num_devices // per_domain
    return _Cluster(hw, {"hosts": hosts}, per_domain, n_dcn, per_domain // per_host)


def _lay_out_slice(cluster: _Cluster, ici: Mapping[str, int]) -> tuple[tuple[AxisLink, ...], bool]:
    """One slice / domain laid out in JAX's order: its ``axes_detail`` and whether the
    order splits physical axes (a serving replica may take a sub-block of a TPU slice,
    ``allow_split_physical_axes``, as MaxText's serving configs allow)."""
    hw = cluster.hw
    if hw.kind != "tpu":
        return plan_hardware_devices(
            hw, ici=dict(ici), hosts=cluster.per_domain_hosts
        ).axes_detail, False
    topology = cluster.where["topology"]
    try:
        return plan_hardware_devices(hw, ici=dict(ici), topology=topology).axes_detail, False
    except PlanError as error:
        if error.code != "physical_axes_split_required":
            raise
    split = plan_hardware_devices(
        hw, ici=dict(ici), topology=topology, allow_split_physical_axes=True
    )
    return split.axes_detail, True


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB"


def _judge(plan: ServingPlan, slo: Mapping[str, float]) -> tuple[str, str] | None:
    """``(code, reason)`` where the layout fails, else ``None``."""
    memory, est = plan.memory_per_device, plan.serving_estimate
    if not memory.fits:
        need = memory.weights + memory.activations
        return (
            "does_not_fit",
            f"weights {_gib(memory.weights)} and activations {_gib(memory.activations)} "
            f"leave room for {est.kv_capacity_tokens} cached tokens a replica, fewer than "
            f"one sequence of {plan.options.model_len} (usable {_gib(memory.usable)} a "
            f"device, {_gib(need)} taken before the KV cache)",
        )
    missed = [
        f"{name} {getattr(est, name):.4g} s > slo {slo[name]:.4g} s"
        for name in ("ttft_s", "tpot_s")
        if slo.get(name) is not None and getattr(est, name) > slo[name]
    ]
    if missed:
        return "misses_slo", "; ".join(missed) + f" (batch {est.batch} a replica)"
    return None


def _check_slo(slo: Mapping[str, Any] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, value in (slo or {}).items():
        if name not in ("ttft_s", "tpot_s"):
            raise PlanError(
                "invalid_serving", f"slo has no member {name!r}; it takes ttft_s, tpot_s"
            )
        if value is None:
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not (0 < value < math.inf):
            raise PlanError(
                "invalid_serving", f"slo.{name} must be a time in seconds above 0, got {value!r}"
            )
        out[name] = float(value)
    return out


def recommend_serving(
    hardware: str | Hardware,
    *,
    model: TransformerSpec | Mapping[str, Any],
    serving: ServingOptions | Mapping[str, Any],
    slo: Mapping[str, Any] | None = None,
    topology: str | None = None,
    slices: int = 1,
    hosts: int | None = None,
    top_k: int = 5,
    calibration: str | CalibrationProfile | None = None,
    max_layouts: int | None = MAX_SERVING_LAYOUTS,
    should_stop: Callable[[], bool] | None = None,
) -> ServingRecommendations:
    """Ranks the serving layouts of a cluster (module docstring).

    Args:
      hardware: catalog name or entry.
      model: a transformer spec or a request's ``model`` object.
      serving: the request's ``serving`` object or its options.
      slo: ``{"ttft_s", "tpot_s"}`` (either optional): a layout whose mean time to first
        token or per output token is above it is rejected (``misses_slo``).
      topology, slices: TPU slice shape and slices.
      hosts: GPU/CPU hosts.
      top_k: candidates to return.
      calibration: a serving profile id (default the hardware kind's for the engine).
      max_layouts: most layouts priced; ``None``: no limit.
      should_stop: called between layouts; true stops the search
        (:class:`~datarax.plan.layout.PlanCancelled`).

    Returns:
      :class:`~datarax.answers.serving.ServingRecommendations`.

    Raises:
      PlanError: ``invalid_serving``, ``invalid_model``, ``invalid_top_k``, the
        planner's cluster codes, ``unknown_calibration``, ``invalid_calibration``,
        ``search_space_too_large``, and ``no_plan_fits`` when no layout fits.
      PlanCancelled: ``should_stop`` answered true.
    """
    hw = get_hardware(hardware)
    options = serving if isinstance(serving, ServingOptions) else ServingOptions.from_json(serving)
    slo_s = _check_slo(slo)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise PlanError("invalid_top_k", f"top_k must be a positive integer, got {top_k!r}")
    spec = model_spec(model)
    if not isinstance(spec, TransformerSpec):
        raise PlanError("invalid_model", "a serving recommendation prices a transformer")
    profile = serving_profile(hw, options.engine, calibration)
    cluster = _cluster(hw, topology, slices, hosts)
    names = ["data", "stage", *(["expert"] if spec.is_moe else []), "tensor"]
    count = count_factorisations(cluster.n_ici, len(names)) * count_factorisations(
        cluster.n_dcn, len(_SLOW_AXES)
    )
    if max_layouts is not None and count > max_layouts:
        raise PlanError(
            "search_space_too_large",
            f"the cluster spans {count} serving layouts (ici over {names}, dcn over "
            f"{list(_SLOW_AXES)}); at most {max_layouts} are searched: use fewer slices or hosts",
        )
    ranked: list[tuple[float, float, int, dict[str, int], dict[str, int], ServingPlan, bool]] = []
    rejections: list[ServingRejection] = []
    for ici_sizes in factorisations(cluster.n_ici, len(names)):
        ici = dict(zip(names, ici_sizes, strict=True))
        try:
            inner, split = _lay_out_slice(cluster, ici)
        except PlanError as error:
            rejections += [
                ServingRejection(ici, dict.fromkeys(names, 1), error.code, error.http_message)
            ]
            continue
        for dcn_sizes in factorisations(cluster.n_dcn, len(_SLOW_AXES)):
            if should_stop is not None and should_stop():
                raise PlanCancelled("the serving recommendation was abandoned")
            slow = dict(zip(_SLOW_AXES, dcn_sizes, strict=True))
            dcn = {name: slow.get(name, 1) for name in names}
            try:
                links = tuple(dcn_links(hw, inner, dcn))
                plan = estimate_serving(hw, links, spec, options, calibration=profile)
            except PlanError as error:
                rejections.append(ServingRejection(ici, dcn, error.code, error.http_message))
                continue
            failed = _judge(plan, slo_s)
            if failed is not None:
                rejections.append(ServingRejection(ici, dcn, *failed))
                continue
            est = plan.serving_estimate
            per_device = est.output_tokens_per_s_per_device or 0.0
            ranked.append((-per_device, est.tpot_s, len(ranked), ici, dcn, plan, split))
    considered = len(ranked) + len(rejections)
    counts: dict[str, int] = {}
    for rejection in rejections:
        counts[rejection.code] = counts.get(rejection.code, 0) + 1
    if not ranked and not any(r.code == "misses_slo" for r in rejections):
        reasons = "; ".join(sorted({r.reason for r in rejections if r.code == "does_not_fit"}))
        raise PlanError(
            "no_plan_fits",
            f"none of the {considered} serving layouts fits ({counts}): "
            f"{reasons[:600] or 'see the layouts'}; use more devices, a smaller weight_dtype "
            "or kv_dtype, or shorter sequences",
        )
    ranked.sort(key=lambda row: row[:3])
    candidates = [
        _candidate(rank, model, cluster, ici, dcn, plan, calibration, split)
        for rank, (_, _, _, ici, dcn, plan, split) in enumerate(ranked[:top_k], start=1)
    ]
    note = None
    if len(candidates) < top_k:
        note = (
            f"{len(candidates)} of the top_k {top_k}: {len(ranked)} of the {considered} "
            f"layouts fit and meet the slo (rejected: {counts})"
        )
    return ServingRecommendations(
        candidates=candidates,
        considered=considered,
        rejected=counts,
        rejections=rejections,
        ranked_by=SERVING_RANKING,
        slo=slo_s or None,
        note=note,
    )


def _candidate(
    rank: int,
    model: TransformerSpec | Mapping[str, Any],
    cluster: _Cluster,
    ici: dict[str, int],
    dcn: dict[str, int],
    plan: ServingPlan,
    calibration: str | CalibrationProfile | None,
    split: bool,
) -> ServingCandidate:
    """One candidate, with the ``POST /v1/meshes`` body that plans its layout."""
    body: dict[str, Any] = {"hardware": cluster.hw.name, **cluster.where, "ici": dict(ici)}
    if split:
        body["allow_split_physical_axes"] = True
    if any(n > 1 for n in dcn.values()):
        body["dcn"] = dict(dcn)
    body["model"] = dict(model) if isinstance(model, Mapping) else plan.model.to_json()
    body["serving"] = {k: v for k, v in plan.options.to_json().items() if v is not None}
    if isinstance(calibration, str):
        body["calibration"] = calibration
    return ServingCandidate(
        rank=rank,
        ici=ici,
        dcn=dcn,
        serving_estimate=plan.serving_estimate,
        memory_per_device=plan.memory_per_device,
        plan_request=body,
    )
