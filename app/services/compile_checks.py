"""Compile checks: XLA's own verdict on a plan, from a supervised compile worker.

:class:`CompileChecks` (built by the lifespan) keeps a bounded queue of checks and one
compile worker process (``python -m app.compiler``), started on the first check and kept
warm for the checks of its platform. Checks run one at a time, in arrival order:

- a full queue (``DATARAX_COMPILE_QUEUE`` waiting) is 429 ``compile_queue_full`` with a
  ``Retry-After`` from the mean compile time seen so far;
- a check past ``DATARAX_COMPILE_TIMEOUT_S`` is ``failed``, and a ``DELETE`` of a
  running check ``cancelled`` in every phase (``phase``: ``starting``, the worker being
  spawned or importing JAX; ``lowering``; ``compiling``): both kill the worker's process
  group (XLA cannot be interrupted mid-compile); the next check starts a fresh worker;
- a worker that dies (``kill -9``, its memory cap ``DATARAX_COMPILE_MEMORY_MB``, an XLA
  crash such as the SIGFPE of an MLP of ``[1048576] * 3`` on CPU) fails the check it was
  running with its signal or exit status, the phase, and the last error lines of its log;
  the memory cap is named only when it was hit (:meth:`CompileChecks._crash_reason`);
  the other checks and the service go on;
- ``fits`` is judged here (:func:`judge_fits`), never by default: XLA's per-device peak
  against the target's memory (TPU: the catalog's HBM; GPU: see below; CPU: the host's
  session budget split over the plan's devices, :func:`cpu_device_bound`), or ``null``
  with ``fits_reason`` where there is none;
- results are cached in SQLite (:mod:`app.storage.compile_checks`) by a key over
  everything that changes the program (target, device order, axes, model, optimizer,
  batch, memory figure) and the jax, jaxlib, libtpu and GPU plugin versions (a GPU target
  names its platform, its CUDA version, device kind and count, so a GPU result is never
  a CPU check's answer); a repeat check is ``done`` when answered.

Targets: a TPU hardware plan compiles against libtpu's description of its topology, in
the plan's own device order; a live plan on CPU devices compiles on the worker's own CPU
devices (as many as the runtime has, ``DATARAX_CPU_DEVICES``, same ids). A live plan on a
GPU host (the runtime's platform ``gpu``) compiles on the host's own GPUs, the ones the
runtime holds, in the plan's device order: that worker starts with ``JAX_PLATFORMS=cuda``
(``rocm`` where ``DATARAX_PLATFORMS`` names it), no preallocation and the platform
allocator, so it takes no memory pool beside the runtime's and holds nothing but its CUDA
context after a compile (the step's arrays are abstract and never allocated). It inherits
the service's environment, so it sees the runtime's ``CUDA_VISIBLE_DEVICES`` and ids. The
first GPU check asks ``python -m app.compiler --describe`` once for those GPUs (ids, kind,
XLA's ``bytes_limit``); a plan naming an id the worker does not have (a plan of another
process of a multi-host group, GPUs changed since it was made) or GPUs the worker cannot
open is 422 ``compile_target_unavailable`` with the reason. ``hbm_bytes`` (for ``fits``) is
``DATARAX_MEMORY_BUDGET_MB`` when set, as on CPU; else the smallest ``bytes_limit`` of the
plan's GPUs (XLA's pool there, the runtime's too: same environment), else the catalog's
memory for that device kind; the target names which (``hbm_source``). GPU hardware plans,
other live platforms and plain abstract plans are 422 ``compile_target_unavailable``,
carrying the plan's memory estimate for the request where there is one.

Workers: at most one at a time. Its platform is ``cpu`` (CPU devices and TPU topologies)
or the GPU's; a check for the other platform stops the idle worker and starts one for its
own (start-up: seconds), so alternating CPU and GPU checks pay a start each, and the host
never holds two compile workers (the one-shot ``--describe`` aside). The memory cap is
``RLIMIT_AS`` on a ``cpu`` worker; a GPU worker cannot have one (CUDA maps address ranges
as large as the GPUs' memory at start and fails under it), so the service samples its
process group's resident memory every ``_RSS_POLL_S`` while it compiles and kills it past
the cap, failing the check with that reason.

Memory per request: one check's JSON (a 65,536-device plan's id list, ~0.5 MB) while it
waits; at most ``DATARAX_COMPILE_QUEUE`` of them. No JAX in this process.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import importlib.metadata
import json
import logging
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.errors import (
    CompileCheckNotFound,
    CompileQueueFull,
    CompileTargetUnavailable,
    ServiceError,
    from_library,
)
from app.core.host_memory import host_memory_bytes
from app.core.ids import new_ulid, utc_now
from app.core.settings import Settings
from app.runtime.environment import runtime_platforms
from app.schemas.base import optimizer_name
from app.schemas.compile_checks import CompileCheckRequest
from app.storage.compile_checks import CompileStore
from datarax.distributed.cost import hardware_memory, memory_estimate
from datarax.distributed.hardware import HARDWARE, get_hardware
from datarax.distributed.model_specs import TransformerSpec, model_spec
from datarax.distributed.planning import PlanError

log = logging.getLogger("datarax.compile")

PROGRAM_VERSION = 3
"""Bumped when :mod:`datarax.distributed.compile_step` builds a different program, or a
result means something else (3: ``fits`` is judged here, null without a memory bound,
where 2 answered true), so cached results of the old one are not answered."""

_WORKER_LOG_LINES = 20
_RSS_POLL_S = 0.25
"""How often a GPU worker's resident memory is sampled against DATARAX_COMPILE_MEMORY_MB."""
_GPU_PLATFORMS = ("cuda", "rocm")
_GPU_PLUGINS = ("jax-cuda12-pjrt", "jax-cuda13-pjrt", "jax-rocm7-pjrt")
_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])  # where `-m app.compiler` resolves


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


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


# ------------------------------------------------------------------------------ targets


def _estimate(
    plan: dict[str, Any],
    model: dict[str, Any],
    optimizer: str,
    batch: int,
    hbm: int | None = None,
) -> Any:
    figures: dict[str, Any] = {"hbm_bytes": hbm}
    dcn_axes = []
    if plan.get("hardware"):
        figures = hardware_memory(get_hardware(plan["hardware"]))
        # The axes that cross slices (their gradients stay in HBM: cost.memory_estimate).
        dcn_axes = [a["name"] for a in plan.get("axes_detail", ()) if a.get("dcn", 1) > 1]
    try:
        return memory_estimate(
            model, plan["axes"], batch, optimizer=optimizer, dcn_axes=dcn_axes, **figures
        )
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
    optimizer = optimizer_name(request.optimizer)
    estimate = _estimate(plan, spec.to_json(), optimizer, batch)
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
        estimate = _estimate(plan, spec.to_json(), optimizer, batch, hbm)
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
        estimate = _estimate(plan, spec.to_json(), optimizer, batch, hbm)  # same bound
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


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.4g} {unit}"
        n /= 1024
    return f"{n:.4g} PiB"  # pragma: no cover - the loop returns


def judge_fits(result: dict[str, Any], hbm_bytes: int | None, source: str | None) -> dict[str, Any]:
    """``result`` with ``fits`` and ``fits_reason`` decided here, never by default.

    - XLA refused the program for memory (``xla_error``): ``fits`` false.
    - a memory bound (``hbm_bytes``, from ``source``): ``fits`` is XLA's
      ``hbm_peak_bytes`` (else ``peak_bytes``) against it.
    - no bound (a GPU without ``bytes_limit`` nor a catalog entry, a host whose memory is
      unknown): ``fits`` is ``None`` (JSON null, unknown), never true by default.

    ``fits_reason`` says which, with the figures.
    """
    out = dict(result)
    if out.get("xla_error"):
        out["fits"] = False
        out["fits_reason"] = "XLA refused the program for memory at compile time (xla_error)"
        return out
    memory = out.get("memory") or {}
    peak = memory.get("hbm_peak_bytes") or memory.get("peak_bytes")
    if peak is None or hbm_bytes is None:
        out["fits"] = None
        out["fits_reason"] = (
            "unknown: there is no memory figure for this target to compare XLA's peak "
            "with (set DATARAX_MEMORY_BUDGET_MB to give one)"
            if peak is not None
            else "unknown: XLA reported no memory figures"
        )
        return out
    fits = peak <= hbm_bytes
    out["fits"] = fits
    out["fits_reason"] = (
        f"XLA's peak of {_size(peak)} per device is {'within' if fits else 'beyond'} the "
        f"{_size(hbm_bytes)} per device available ({source})"
    )
    return out


def _hbm_source(work: dict[str, Any]) -> str | None:
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
        source = "DATARAX_MEMORY_BUDGET_MB"
    else:
        limits = [by_id[i].get("bytes_limit") for i in ids]
        hbm, source = (min(int(x) for x in limits), "bytes_limit") if all(limits) else (None, None)
        if hbm is None:
            catalog = {hw.device_kind: hw for hw in HARDWARE.values()}
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


def group_rss_bytes(pgid: int) -> int:
    """Resident memory of every process in process group ``pgid`` (Linux ``/proc``; 0
    elsewhere): the GPU worker and anything it runs (``ptxas``)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # from field 3 (state) on
        if len(fields) > 21 and int(fields[2]) == pgid:  # field 5: pgrp; field 24: rss
            total += int(fields[21]) * page
    return total


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
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


def estimate_error(estimate: dict[str, Any] | None, result: dict[str, Any]) -> Any:
    """The estimate against XLA, field by field: ``{field: {"estimate", "xla",
    "relative"}}`` with ``relative = (estimate - xla) / xla``, and ``fits_agrees``.

    Fields: ``argument_bytes`` (estimate: params + optimizer + batch, what the step takes
    in), ``temp_bytes`` (grads + activations + temporaries, what it makes),
    ``peak_bytes`` (total, against XLA's peak, which on TPU also counts on-chip VMEM) and
    ``hbm_peak_bytes`` (total, against XLA's HBM allocation, what ``fits`` is judged on
    and the estimate models).
    """
    known = estimate is not None and None not in (estimate.get("fits"), result.get("fits"))
    if not estimate or not result.get("memory"):
        if known:
            return {"fits_agrees": estimate["fits"] == result["fits"]}
        return None
    mem = result["memory"]
    pairs = {
        "argument_bytes": estimate["params"] + estimate["optimizer"] + estimate["batch"],
        "temp_bytes": estimate["grads"] + estimate["activations"] + estimate.get("temporaries", 0),
        "peak_bytes": estimate["total"],
        "hbm_peak_bytes": estimate["total"],
    }
    out: dict[str, Any] = {}
    for name, est in pairs.items():
        xla = mem.get(name)
        if xla is None:  # a result cached before hbm_peak_bytes
            continue
        out[name] = {
            "estimate": est,
            "xla": xla,
            "relative": None if not xla else (est - xla) / xla,
        }
    if known:
        out["fits_agrees"] = estimate["fits"] == result["fits"]
    return out


# ------------------------------------------------------------------------------ service


@dataclass
class _Job:
    check: dict[str, Any]
    work: dict[str, Any]
    key: str
    cancelled: bool = False
    answered: bool = False
    """The worker's result or error is in: a cancel from then on changes nothing."""
    done: asyncio.Event = field(default_factory=asyncio.Event)


class CompileChecks:
    """The queue, the worker and the checks (one per service; built by the lifespan)."""

    def __init__(
        self,
        settings: Settings,
        *,
        worker_argv: list[str] | None = None,
        describe_argv: list[str] | None = None,
    ):
        self.settings = settings
        self.store = CompileStore(settings.db)
        self._worker_argv = worker_argv
        self._describe_argv = describe_argv
        self._proc_platform: str | None = None
        self._rss_killed: int | None = None
        self._out_of_memory: str | None = None
        """The worker's first log line that shows a failed allocation, if any."""
        self._gpus: dict[str, Any] | None = None
        self._describe_lock = asyncio.Lock()
        self._queue: collections.deque[_Job] = collections.deque()
        self._jobs: dict[str, _Job] = {}
        self._running: _Job | None = None
        self._wake = asyncio.Event()
        self._proc: asyncio.subprocess.Process | None = None
        self._log_tail: collections.deque[str] = collections.deque(maxlen=_WORKER_LOG_LINES)
        self._log_task: asyncio.Task | None = None
        self._runner: asyncio.Task | None = None
        self._compile_seconds: list[float] = []
        self.worker_starts = 0

    # -------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        await asyncio.to_thread(self.store.open)
        stale = await self.store.fail_unfinished("the service restarted before the check ended")
        if stale:
            log.warning("%d compile checks left unfinished by a previous process: failed", stale)
        self._runner = asyncio.create_task(self._run(), name="compile-checks")

    async def stop(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        await self._kill_worker()
        self.store.close()

    @property
    def worker_pid(self) -> int | None:
        return None if self._proc is None or self._proc.returncode is not None else self._proc.pid

    # ---------------------------------------------------------------------- answers

    async def submit(self, mesh_id: str, plan: dict[str, Any], request: CompileCheckRequest):
        """Queues a check (or answers it from the cache); returns its JSON.

        Raises:
          CompileTargetUnavailable, CompileQueueFull, and the library's codes.
        """
        gpus = await self.describe_gpus() if needs_gpu(plan) else None
        work = await asyncio.to_thread(check_target, plan, request, self.settings, gpus)
        estimate = work.pop("estimate")
        key = cache_key(work)
        check: dict[str, Any] = {
            "id": "c_" + new_ulid(),
            "mesh_id": mesh_id,
            "status": "queued",
            "created_at": utc_now(),
            "cached": False,
            "request": request.model_dump(exclude_none=True),
            "target": work["target"],
            "estimate": estimate,
        }
        cached = await self.store.get_result(key)
        if cached is not None:
            self._finish(check, estimate, result=cached, cached=True)
            await self.store.put_check(check)
            return check
        if len(self._queue) >= self.settings.compile_queue:
            raise CompileQueueFull(
                f"{len(self._queue)} compile checks are waiting (DATARAX_COMPILE_QUEUE="
                f"{self.settings.compile_queue}); retry after the Retry-After seconds",
                headers={"Retry-After": str(self._retry_after())},
            )
        job = _Job(check, work, key)
        self._jobs[check["id"]] = job
        self._queue.append(job)
        await self.store.put_check(check)
        self._wake.set()
        return self._view(job)

    async def get(self, cid: str) -> dict[str, Any]:
        job = self._jobs.get(cid)
        if job is not None:
            return self._view(job)
        check = await self.store.get_check(cid)
        if check is None:
            raise CompileCheckNotFound(f"no compile check with id {cid!r}")
        return check

    async def list(self, mesh_id: str, limit: int, offset: int) -> dict[str, Any]:
        items, total = await self.store.list_checks(mesh_id, limit, offset)
        items = [self._view(self._jobs[c["id"]]) if c["id"] in self._jobs else c for c in items]
        return {"items": items, "total": total}

    async def cancel(self, cid: str) -> dict[str, Any]:
        """Cancels a queued or running check; a finished one is answered as it is.

        Every phase: a queued check leaves the queue; a running one (its worker starting,
        lowering or compiling) has its worker's process group killed, and the runner,
        which looks at ``cancelled`` after each step that could not be interrupted (a
        store write, spawning the worker), settles it ``cancelled`` at once. Only a check
        whose answer is already in (``answered``) ends as that answer.
        """
        job = self._jobs.get(cid)
        if job is None:
            return await self.get(cid)
        if job.answered:
            await job.done.wait()
            return await self.get(cid)
        job.cancelled = True
        if job in self._queue:
            self._queue.remove(job)
            await self._settle(job, status="cancelled")
        elif job is self._running:
            await self._kill_worker()  # the runner sees EOF and settles the job
            await job.done.wait()
        return await self.get(cid)

    # ----------------------------------------------------------------------- runner

    def _view(self, job: _Job) -> dict[str, Any]:
        check = dict(job.check)
        if check["status"] == "queued" and job in self._queue:
            check["position"] = self._queue.index(job) + 1
        return check

    def _retry_after(self) -> int:
        seen = self._compile_seconds[-20:]
        mean = sum(seen) / len(seen) if seen else 10.0
        return max(1, math.ceil(mean * (len(self._queue) + 1)))

    def _finish(
        self,
        check: dict[str, Any],
        estimate: Any,
        *,
        result: dict[str, Any] | None = None,
        cached: bool = False,
    ) -> None:
        check.update(status="done", result=result, cached=cached, finished_at=utc_now())
        check["estimate_error"] = estimate_error(estimate, result or {})
        check.pop("position", None)
        check.pop("phase", None)

    async def _settle(
        self, job: _Job, *, status: str, result: dict | None = None, error: dict | None = None
    ) -> None:
        check = job.check
        if status == "done":
            self._finish(check, check.get("estimate"), result=result)
            await self.store.put_result(job.key, check["finished_at"], result or {})
        else:
            check.update(status=status, finished_at=utc_now())
            check.pop("phase", None)
            check.pop("position", None)
            if error is not None:
                check["error"] = error
        await self.store.put_check(check)
        self._jobs.pop(check["id"], None)
        job.done.set()

    async def _run(self) -> None:
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            job = self._queue.popleft()
            self._running = job
            try:
                await self._run_one(job)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # a bug here must not stop the queue
                log.exception("compile check %s", job.check["id"])
                if not job.done.is_set():
                    await self._settle(
                        job,
                        status="failed",
                        error={"code": "compile_failed", "detail": f"internal error: {error}"},
                    )
            finally:
                self._running = None

    async def _run_one(self, job: _Job) -> None:
        job.check["status"] = "compiling"
        job.check.pop("position", None)
        platform = worker_platform(job.work["target"], self.settings)
        if not self._worker_alive(platform):
            job.check["phase"] = "starting"
        await self.store.put_check(job.check)
        if job.cancelled:  # cancelled while the store wrote: nothing to kill yet
            await self._settle(job, status="cancelled")
            return
        try:
            proc = await self._ensure_worker(platform)
        except Exception as error:
            if job.cancelled:
                await self._settle(job, status="cancelled")
            else:
                detail = str(error) or type(error).__name__
                await self._settle(
                    job, status="failed", error={"code": "compile_failed", "detail": detail}
                )
            return
        if job.cancelled:  # cancelled in a moment the kill could not reach (spawning)
            await self._kill_worker()
            await self._reap_worker()
            await self._settle(job, status="cancelled")
            return
        if job.check.get("phase") == "starting":
            job.check.pop("phase")
        assert proc.stdin is not None and proc.stdout is not None
        request = {"id": job.check["id"], **job.work}
        started = time.monotonic()
        deadline = started + self.settings.compile_timeout_s
        watchdog = None
        if platform != "cpu" and self.settings.compile_memory_mb > 0:
            watchdog = asyncio.create_task(self._watch_rss(proc))
        try:
            proc.stdin.write((json.dumps(request) + "\n").encode())
            await proc.stdin.drain()
            while True:
                line = await asyncio.wait_for(
                    proc.stdout.readline(), timeout=max(0.0, deadline - time.monotonic())
                )
                if not line:
                    raise ConnectionResetError("worker closed its output")
                message = json.loads(line)
                if message.get("id") != job.check["id"]:
                    continue
                if "phase" in message:
                    job.check["phase"] = message["phase"]
                    continue
                job.answered = True
                break
        except TimeoutError:
            await self._kill_worker()
            await self._settle(
                job,
                status="failed",
                error={
                    "code": "compile_failed",
                    "detail": f"the compile ran past DATARAX_COMPILE_TIMEOUT_S="
                    f"{self.settings.compile_timeout_s:g} s; the worker was stopped",
                },
            )
            return
        except (ConnectionResetError, BrokenPipeError, ValueError):
            status = await self._reap_worker()
            if job.cancelled:
                await self._settle(job, status="cancelled")
            else:
                await self._settle(
                    job,
                    status="failed",
                    error={"code": "compile_failed", "detail": self._crash_reason(status)},
                )
            return
        finally:
            if watchdog is not None:
                watchdog.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watchdog
        self._compile_seconds.append(time.monotonic() - started)
        if "result" in message:
            work = job.work
            result = judge_fits(message["result"], work["hbm_bytes"], _hbm_source(work))
            await self._settle(job, status="done", result=result)
        else:
            await self._settle(job, status="failed", error=message.get("error"))

    # ----------------------------------------------------------------------- worker

    def worker_argv(self, platform: str = "cpu", *, describe: bool = False) -> list[str]:
        """The worker's command line for ``platform`` (``cpu``, ``cuda``, ``rocm``)."""
        if describe and self._describe_argv is not None:
            return self._describe_argv
        if not describe and self._worker_argv is not None:
            return self._worker_argv
        argv = [
            sys.executable,
            "-m",
            "app.compiler",
            "--platform",
            platform,
            "--memory-mb",
            str(self.settings.compile_memory_mb),
            "--cpu-devices",
            str(self.settings.cpu_devices),
            "--log-level",
            "warning",
        ]
        return [*argv, "--describe"] if describe else argv

    @staticmethod
    def _worker_env() -> dict[str, str]:
        """The service's environment (so ``CUDA_VISIBLE_DEVICES`` and the XLA memory
        settings are the runtime's); the worker sets its platform itself before JAX
        starts (:func:`app.compiler.__main__.environment`)."""
        env = dict(os.environ)
        env.pop("JAX_PLATFORMS", None)
        return env

    async def describe_gpus(self) -> dict[str, Any]:
        """The compile worker's GPUs (``python -m app.compiler --describe``), asked once
        and kept for the service's life (the host's GPUs do not change under a running
        runtime); a failure (``{"error"}``) is not kept, the next GPU check asks again."""
        async with self._describe_lock:
            if self._gpus is not None:
                return self._gpus
            described = await self._describe(gpu_platform(self.settings))
            if not described.get("error"):
                self._gpus = described
            return described

    async def _describe(self, platform: str) -> dict[str, Any]:
        proc = await asyncio.create_subprocess_exec(
            *self.worker_argv(platform, describe=True),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=_PROJECT_ROOT,
            env=self._worker_env(),
            start_new_session=True,
        )
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(), timeout=self.settings.runtime_start_timeout_s
            )
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            return {
                "error": f"describing the GPUs took longer than DATARAX_RUNTIME_START_TIMEOUT_S="
                f"{self.settings.runtime_start_timeout_s:g} s"
            }
        lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
        try:
            answer = json.loads(lines[-1]) if lines else {}
        except ValueError:
            answer = {}
        if isinstance(answer, dict) and (answer.get("devices") or answer.get("error")):
            return answer
        tail = " | ".join(err.decode(errors="replace").strip().splitlines()[-3:])[-600:]
        return {"error": f"the compile worker exited with status {proc.returncode}: {tail}"}

    def _worker_alive(self, platform: str) -> bool:
        """A warm worker of ``platform`` is there (no start-up for the next check)."""
        proc = self._proc
        return proc is not None and proc.returncode is None and self._proc_platform == platform

    async def _ensure_worker(self, platform: str = "cpu") -> asyncio.subprocess.Process:
        if self._proc is not None and self._proc.returncode is None:
            if self._proc_platform == platform:
                return self._proc
            await self._stop_idle_worker()  # a check for the other platform: one at a time
        self._log_tail.clear()
        self._rss_killed = None
        self._out_of_memory = None
        self._proc_platform = platform
        env = self._worker_env()
        proc = await asyncio.create_subprocess_exec(
            *self.worker_argv(platform),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=_PROJECT_ROOT,
            env=env,
            start_new_session=True,
            limit=64 * 2**20,
        )
        self._proc = proc
        self.worker_starts += 1
        self._log_task = asyncio.create_task(self._pump_log(proc))
        if self._running is not None and self._running.cancelled:
            await self._kill_worker()  # cancelled while it was spawned: it reads EOF below
        assert proc.stdout is not None
        line = await asyncio.wait_for(
            proc.stdout.readline(), timeout=self.settings.runtime_start_timeout_s
        )
        if not line or not json.loads(line).get("ready"):
            status = await self._reap_worker()
            raise RuntimeError("the compile worker did not start: " + self._crash_reason(status))
        return proc

    async def _pump_log(self, proc: asyncio.subprocess.Process) -> None:
        """The worker's stderr (libtpu and XLA warnings, tracebacks) into the log."""
        assert proc.stderr is not None
        async for raw in proc.stderr:
            text = raw.decode(errors="replace").rstrip()
            if text:
                self._log_tail.append(text)
                if self._out_of_memory is None and _shows_out_of_memory((text,)):
                    self._out_of_memory = text[-300:]  # kept: a stack trace may follow
                log.debug("compile worker: %s", text)

    async def _reap_worker(self) -> int | None:
        proc = self._proc
        if proc is None:
            return None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), timeout=10)
        if self._log_task is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._log_task, timeout=2)
        self._proc = None
        return proc.returncode

    async def _stop_idle_worker(self) -> None:
        """Ends the idle worker: its input closed (it exits), SIGKILL after 10 s."""
        proc = self._proc
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), timeout=10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        await self._reap_worker()

    async def _watch_rss(self, proc: asyncio.subprocess.Process) -> None:
        """Kills a GPU worker whose process group's resident memory passes the cap."""
        cap = self.settings.compile_memory_mb * 2**20
        while proc.returncode is None:
            rss = await asyncio.to_thread(group_rss_bytes, proc.pid)
            if rss > cap:
                self._rss_killed = rss
                log.warning("compile worker at %d MiB resident, past the cap: killed", rss >> 20)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                return
            await asyncio.sleep(_RSS_POLL_S)

    async def _kill_worker(self) -> None:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if self._running is None:
            await self._reap_worker()

    def _crash_reason(self, status: int | None) -> str:
        """Why the worker died, from what is known, never a guess: the signal or exit
        status; the memory cap only when it was hit (the RSS watchdog killed a GPU
        worker, or the worker's log shows an allocation that failed); the last error
        lines of its log."""
        phase = f" while {self._running.check.get('phase')}" if self._phase_known() else ""
        if status is None:
            how = "ended"
        elif status < 0:
            name = signal.Signals(-status).name
            described = signal.strsignal(-status) or name
            how = f"died of {name} ({described})"
        else:
            how = f"exited with status {status}"
        cap = self.settings.compile_memory_mb
        tail = " | ".join(
            line
            for line in self._log_tail
            if "Error" in line or "error" in line or "memory" in line or "failed" in line
        )[-600:]
        reason = f"the compile worker {how}{phase}"
        if self._rss_killed is not None:
            reason += (
                f": its resident memory reached {self._rss_killed >> 20} MiB, past its cap "
                f"of {cap} MiB (DATARAX_COMPILE_MEMORY_MB), and the service killed it"
            )
        elif self._out_of_memory is not None:
            reason += (
                f": it ran out of memory under its cap of {cap} MiB "
                "(DATARAX_COMPILE_MEMORY_MB; raise it, or compile a smaller step)"
                if cap
                else ": it ran out of host memory"
            )
            reason += f" ({self._out_of_memory})"
        elif status == -signal.SIGKILL:
            reason += (
                ": the service did not send it (another process did, or the kernel's "
                "out-of-memory killer)"
            )
        elif status is not None and status < 0:
            reason += ": XLA or the compiler crashed on this program; no memory cap was hit"
        return reason + (f"; its last errors: {tail}" if tail else "")

    def _phase_known(self) -> bool:
        return self._running is not None and bool(self._running.check.get("phase"))


_OUT_OF_MEMORY_SIGNS = (
    "MemoryError",
    "bad_alloc",
    "Cannot allocate memory",
    "out of memory",
    "Out of memory",
    "pthread_create() failed",  # no address space left for a thread's stack (RLIMIT_AS)
    "pthread_create failed",  # the same from LLVM ("LLVM ERROR: pthread_create failed: ...")
    "Memory allocation still failed",  # OpenBLAS, at import under a small cap
    "ailed to allocate",
)
"""What a worker's log shows when an allocation failed (measured with jax 0.12.0.1 under
RLIMIT_AS: XLA's compile thread fails in ``pthread_create`` and aborts; OpenBLAS gives up
at import; Python raises ``MemoryError``; C++ ``std::bad_alloc``)."""


def _shows_out_of_memory(lines: Any) -> bool:
    return any(sign in line for line in lines for sign in _OUT_OF_MEMORY_SIGNS)


__all__ = [
    "CompileChecks",
    "cache_key",
    "check_target",
    "compiler_versions",
    "cpu_device_bound",
    "estimate_error",
    "gpu_platform",
    "group_rss_bytes",
    "judge_fits",
    "needs_gpu",
    "worker_platform",
]
