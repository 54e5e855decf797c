"""What a compile check compiles for a plan, and the key its result is cached under.

Targets: a TPU hardware plan compiles against libtpu's description of its topology, in
the plan's own device order; a live plan on CPU devices compiles on the worker's own CPU
devices (as many as the runtime has, ``DATARAX_CPU_DEVICES``, same ids). A live plan on a
GPU host (the runtime's platform ``gpu``) compiles on the host's own GPUs, the ones the
runtime holds, in the plan's device order (the worker that does it:
:mod:`app.workers.compile_worker`). The first GPU check asks
``python -m app.compiler --describe`` once for those GPUs (ids, kind, XLA's
``bytes_limit``); a plan naming an id the worker does not have (a plan of another process
of a multi-host group, GPUs changed since it was made) or GPUs the worker cannot open is
422 ``compile_target_unavailable`` with the reason. ``hbm_bytes`` (for ``fits``) is
``DATARAX_MEMORY_BUDGET_MB`` when set, as on CPU; else the smallest ``bytes_limit`` of the
plan's GPUs (XLA's pool there, the runtime's too: same environment), else the catalog's
memory for that device kind; the target names which (``hbm_source``). GPU hardware plans,
other live platforms and plain abstract plans are 422 ``compile_target_unavailable``,
carrying the plan's memory estimate for the request where there is one.

Cache keys (:func:`cache_key`) cover everything that changes the program (target, device
order, axes, model, optimizer, batch, memory figure) and the jax, jaxlib, libtpu and GPU
plugin versions (a GPU target names its platform, its CUDA version, device kind and
count, so a GPU result is never a CPU check's answer).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
import os
from collections.abc import Mapping
from typing import Any

from app.core.errors import CompileTargetUnavailable, ServiceError, from_library
from app.core.host_memory import host_memory_bytes
from app.core.settings import Settings
from app.runtime.environment import runtime_platforms
from app.schemas.base import optimizer_name, shards_over_data
from app.schemas.compile_checks import CompileCheckRequest
from datarax.errors import PlanError
from datarax.estimate.memory import hardware_memory, memory_estimate
from datarax.hardware.chips import HARDWARE, get_hardware
from datarax.hardware.entry import Hardware
from datarax.parallel.kinds import check_compiled, kinds_by_alias, shards_where
from datarax.parallel.options import ParallelOptions, check_program_builds
from datarax.specs.model_specs import TransformerSpec, model_spec

PROGRAM_VERSION = 6
"""Bumped when :mod:`datarax.spmd.compile_step` builds a different program, or a
result means something else (3: ``fits`` is judged here, null without a memory bound,
where 2 answered true), so cached results of the old one are not answered."""

_GPU_PLATFORMS = ("cuda", "rocm")
_GPU_PLUGINS = ("jax-cuda12-pjrt", "jax-cuda13-pjrt", "jax-rocm7-pjrt")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


DATARAX_PROGRAM = {"name": "datarax", "version": _version("datarax-mesh")}
"""A result's ``program`` for the library's own step (DESIGN v1.4): the package's version."""


def compiler_versions() -> dict[str, str | None]:
    """The versions that change what XLA answers: jax, jaxlib and libtpu, and the GPU
    PJRT plugins that are installed (absent ones are left out, so a host without them
    keeps its keys)."""
    versions = {name: _version(name) for name in ("jax", "jaxlib", "libtpu")}
    for name in _GPU_PLUGINS:
        found = _version(name)
        if found is not None:
            versions[name] = found
    return versions


def _estimate(
    plan: dict[str, Any],
    model: dict[str, Any],
    optimizer: str,
    batch: int,
    hbm: int | None = None,
    zero1: bool = False,
    program: str = "datarax",
) -> dict[str, Any]:
    figures: Mapping[str, Any] = {"hbm_bytes": hbm}
    dcn_axes = []
    if plan.get("hardware"):
        figures = hardware_memory(get_hardware(plan["hardware"]))
        # The axes that cross slices (their gradients stay in HBM: cost.memory_estimate).
        dcn_axes = [a["name"] for a in plan.get("axes_detail", ()) if a.get("dcn", 1) > 1]
    options = ParallelOptions.from_json(
        pipeline=plan.get("pipeline"),
        context_parallel=plan.get("context_parallel"),
        shard_over_data=bool(plan.get("shard_over_data")) or zero1,
    )
    try:
        return memory_estimate(
            model,
            plan["axes"],
            batch,
            optimizer=optimizer,
            dcn_axes=dcn_axes,
            options=options,
            program=program,
            **figures,
        ).to_json()
    except PlanError as error:  # the batch or the axes' roles do not suit the model
        raise from_library(error) from None


def needs_gpu(plan: dict[str, Any]) -> bool:
    """``plan`` is a live plan on a GPU host: it compiles on the compile worker's GPUs."""
    return bool(plan.get("live")) and not plan.get("hardware") and plan.get("platform") == "gpu"


def check_target(
    plan: dict[str, Any],
    request: CompileCheckRequest,
    settings: Settings,
    gpu: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What the worker compiles for ``plan``: ``{"target", "axes", "device_ids", "model",
    "optimizer", "global_batch", "hbm_bytes", "estimate"}``.

    Args:
      plan: the stored plan (its JSON).
      request: the check's body.
      settings: the service settings.
      gpu: for a live plan on a GPU host (:func:`needs_gpu`), the compile worker's GPUs as
        ``python -m app.compiler --describe`` answers them (``{"devices": [{"id", "kind",
        "bytes_limit"}], "jax_platform", "platform_version", "visible_devices"}``, or
        ``{"error"}`` when it could not open them).

    Raises:
      CompileTargetUnavailable: GPU hardware, a live GPU plan whose devices the worker
        does not have (or cannot open), a plain abstract plan (no hardware), or a TPU
        generation without libtpu here.
      ServiceError: the library's codes for a model, batch or axis roles it refuses.
    """
    model = request.model.model_dump(exclude_none=True)
    try:
        spec = model_spec(model)
    except PlanError as error:
        raise from_library(error) from None
    shape = request.batch_shape or (plan.get("batch") or {}).get("shape")
    if not shape:
        raise ServiceError(
            "the check needs a batch: send batch_shape (its first entry is the global batch), "
            "or plan the mesh with batch_shape",
            code="invalid_batch_shape",
        )
    batch = int(shape[0])
    _check_sizes(spec, batch)
    _check_buildable(plan)
    optimizer = optimizer_name(request.optimizer)
    zero1 = shards_over_data(request.optimizer)
    estimate = _estimate(plan, spec.to_json(), optimizer, batch, zero1=zero1)
    extra = {"estimate": estimate}
    ids = [int(i) for i in _flatten(plan["device_grid"])]
    hbm = None
    if plan.get("hardware"):
        hardware = get_hardware(plan["hardware"])
        hbm = hardware.hbm_bytes
        if hardware.kind != "tpu":
            raise CompileTargetUnavailable(
                f"{hardware.name} plans cannot be compiled here: this host has no "
                f"{hardware.kind.upper()} of that kind, and only TPU topologies can be "
                "compiled without the chips (libtpu); the estimate is in 'estimate'",
                extra=extra,
            )
        if _version("libtpu") is None:
            raise CompileTargetUnavailable(
                "TPU plans compile through libtpu, which is not installed here; install the "
                "extra: pip install -c constraints.txt 'jax[tpu]==0.12.0.1'",
                extra=extra,
            )
        target = {
            "kind": "tpu",
            "hardware": hardware.name,
            "topology": plan["topology"],
            "slices": int(plan.get("slices") or 1),
            "hbm_source": f"catalog:{hardware.name}",
        }
    elif needs_gpu(plan):
        target, hbm = _gpu_target(ids, gpu, settings, extra)
        estimate = _estimate(plan, spec.to_json(), optimizer, batch, hbm, zero1)
    elif plan.get("live"):
        if plan.get("platform") != "cpu":
            raise CompileTargetUnavailable(
                f"live plans on {plan.get('platform')!r} devices are not compiled by the "
                "compile worker (it compiles on CPU and GPU devices); the estimate is in "
                "'estimate'",
                extra=extra,
            )
        if len(ids) > settings.cpu_devices or max(ids, default=0) >= settings.cpu_devices:
            raise CompileTargetUnavailable(
                f"the plan names {len(ids)} CPU devices but the compile worker has "
                f"{settings.cpu_devices} (DATARAX_CPU_DEVICES)",
                extra=extra,
            )
        hbm, source = cpu_device_bound(settings, len(ids))
        target = {"kind": "cpu", "devices": settings.cpu_devices, "hbm_source": source}
        estimate = _estimate(plan, spec.to_json(), optimizer, batch, hbm, zero1)  # same bound
    else:
        raise CompileTargetUnavailable(
            "this plan is abstract without hardware, so there is no compiler to ask: plan it "
            "with hardware (e.g. {'hardware': 'tpu-v5e', 'topology': '16x16', 'ici': {...}}) "
            "or as a live plan",
            extra=extra,
        )
    return {
        "target": target,
        "axes": dict(plan["axes"]),
        "device_ids": ids,
        "model": spec.to_json(),
        "optimizer": optimizer,
        "global_batch": batch,
        "hbm_bytes": hbm,
        "estimate": estimate,
        # the plan's context strategy and ZeRO-1 (or the check's optimizer asking for it)
        "context_parallel": dict(plan.get("context_parallel") or {}),
        "pipeline": dict(plan.get("pipeline") or {}),
        "shard_over_data": bool(plan.get("shard_over_data")) or zero1,
    }


def cpu_device_bound(settings: Settings, devices: int) -> tuple[int | None, str | None]:
    """Memory per device that a live CPU plan's step must fit in, and where it comes from.

    A host's CPU devices share its memory, and XLA's figures are per device, so the
    bound is the memory sessions may use on this host (``DATARAX_MEMORY_BUDGET_MB``, else
    ``DATARAX_MEMORY_FRACTION`` of the host's memory or container limit: the runtime's
    own admission budget) split over the plan's ``devices``. ``(None, None)`` where the
    host's memory is unknown: ``fits`` is then unknown too (:func:`judge_fits`).
    """
    if settings.memory_budget_mb:
        whole: int | None = int(settings.memory_budget_mb * 2**20)
        source = "DATARAX_MEMORY_BUDGET_MB"
    else:
        capacity = host_memory_bytes()
        whole = None if capacity is None else int(capacity * settings.memory_fraction)
        source = f"host memory x DATARAX_MEMORY_FRACTION={settings.memory_fraction:g}"
    if whole is None:
        return None, None
    return whole // max(1, devices), f"{source}, shared by {devices} CPU devices"


def hbm_source(work: dict[str, Any]) -> str | None:
    return work["target"].get("hbm_source")


def _gpu_target(
    ids: list[int], gpu: dict[str, Any] | None, settings: Settings, extra: dict[str, Any]
) -> tuple[dict[str, Any], int | None]:
    """The GPU target of a live plan and its ``hbm_bytes`` (see the module doc)."""
    if not gpu or gpu.get("error") or not gpu.get("devices"):
        reason = (gpu or {}).get("error") or "it was not asked for them"
        raise CompileTargetUnavailable(
            "live GPU plans compile on this host's GPUs in the compile worker, which "
            f"could not open them: {reason}; the estimate is in 'estimate'",
            extra=extra,
        )
    by_id = {int(d["id"]): d for d in gpu["devices"]}
    missing = sorted(set(ids) - set(by_id))
    if missing:
        shown = ", ".join(str(i) for i in missing[:8]) + (", ..." if len(missing) > 8 else "")
        visible = gpu.get("visible_devices")
        raise CompileTargetUnavailable(
            f"the plan names GPU ids {shown} that the compile worker does not have: it sees "
            f"ids {sorted(by_id)} on this host (CUDA_VISIBLE_DEVICES={visible!r}, the "
            "runtime's); a plan over other processes' GPUs, or made before the GPUs "
            "changed, cannot be compiled here; the estimate is in 'estimate'",
            extra=extra,
        )
    kinds = sorted({str(by_id[i]["kind"]) for i in ids})
    if settings.memory_budget_mb:
        hbm: int | None = int(settings.memory_budget_mb * 2**20)
        source: str | None = "DATARAX_MEMORY_BUDGET_MB"
    else:
        limits = [by_id[i].get("bytes_limit") for i in ids]
        hbm, source = (min(int(x) for x in limits), "bytes_limit") if all(limits) else (None, None)
        if hbm is None:
            catalog: dict[str, Hardware] = {}
            for hw in HARDWARE.values():  # the first entry of a device kind (h100-sxm)
                catalog.setdefault(hw.device_kind, hw)
            known = [catalog[k] for k in kinds if k in catalog]
            if known and len(known) == len(kinds):
                smallest = min(known, key=lambda hw: hw.hbm_bytes)
                hbm, source = smallest.hbm_bytes, f"catalog:{smallest.name}"
    target = {
        "kind": "gpu",
        "platform": gpu.get("jax_platform") or "cuda",
        "platform_version": gpu.get("platform_version"),
        "device_kind": ", ".join(kinds),
        "devices": len(by_id),
        "hbm_source": source,
    }
    return target, hbm


_MAX_ELEMENTS = 2**62
"""XLA aborts its process on an array of more elements than this ("overflow in static
extent product", measured with jax 0.12.0.1); such a model is refused before it is sent."""


def _check_sizes(spec: Any, batch: int) -> None:
    """422 ``model_too_large`` when an array of the step has more elements than XLA takes."""
    sizes = {g.path: g.repeat * math.prod(g.shape) for g in spec.params()}
    if isinstance(spec, TransformerSpec):
        tokens = batch * spec.seq_len
        widest = max(spec.d_model, spec.d_ff, spec.vocab, spec.heads * spec.seq_len)
        sizes["activations"] = spec.layers * tokens * widest
    else:
        sizes["activations"] = batch * max(spec.features)
    name, largest = max(sizes.items(), key=lambda item: item[1])
    if largest > _MAX_ELEMENTS:
        raise ServiceError(
            f"the step's {name} would hold {largest:.3g} elements, beyond the {_MAX_ELEMENTS:.3g} "
            "that XLA can lower (it aborts on such a shape); shrink the model or the batch",
            code="model_too_large",
        )


def _check_buildable(plan: Mapping[str, Any]) -> None:
    """422 before any compile when the library's program would not build what the plan
    prices (``invalid_parallelism``): a pipeline schedule other than ``gpipe`` and
    ``circular``."""
    kinds = kinds_by_alias()
    axes = {name: int(size) for name, size in plan["axes"].items() if name in kinds}
    try:
        check_compiled(axes, {name: kinds[name].name for name in axes})
    except PlanError as error:
        raise from_library(error) from None
    try:
        check_program_builds(
            stages=shards_where(axes, lambda kind: kind.splits_layers),
            context=shards_where(axes, lambda kind: kind.splits_sequence),
            schedule=(plan.get("pipeline") or {}).get("schedule"),
            strategy=(plan.get("context_parallel") or {}).get("strategy"),
        )
    except PlanError as error:
        raise from_library(error) from None


def _flatten(grid: Any) -> list[int]:
    if isinstance(grid, list):
        return [i for item in grid for i in _flatten(item)]
    return [grid]


def gpu_platform(settings: Settings) -> str:
    """JAX's platform for a GPU worker: ``rocm`` where the runtime's platforms name it
    (``DATARAX_PLATFORMS``, else ``JAX_PLATFORMS``, else detected:
    :func:`app.runtime.environment.runtime_platforms`), else ``cuda``."""
    named = runtime_platforms(settings, os.environ)[0]
    for name in named.split(","):
        if name.strip() in _GPU_PLATFORMS:
            return name.strip()
    return "cuda"


def worker_platform(target: dict[str, Any], settings: Settings) -> str:
    """``--platform`` of the worker that compiles for ``target``: the GPU's JAX platform
    for a GPU target, else ``cpu`` (CPU devices and TPU topologies)."""
    if target.get("kind") == "gpu":
        return str(target.get("platform") or gpu_platform(settings))
    return "cpu"


def cache_key(work: dict[str, Any]) -> str:
    """sha256 over what changes the compiled program, and the compiler's versions."""
    ids = hashlib.sha256(json.dumps(work["device_ids"]).encode()).hexdigest()
    described = {
        "program": PROGRAM_VERSION,
        "versions": compiler_versions(),
        "target": work["target"],
        "axes": list(work["axes"].items()),
        "device_ids": ids,
        "model": work["model"],
        "optimizer": work["optimizer"],
        "global_batch": work["global_batch"],
        "hbm_bytes": work["hbm_bytes"],
        "context_parallel": work.get("context_parallel") or {},
        "pipeline": work.get("pipeline") or {},
        "shard_over_data": bool(work.get("shard_over_data")),
        # a serving plan's decode step (its batch, length and weight dtype)
        **({"serving": work["serving"]} if work.get("serving") else {}),
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()
