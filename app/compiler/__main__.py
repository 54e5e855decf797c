"""``python -m app.compiler``: the compile worker, started and supervised by
:class:`app.workers.compile_worker.CompileWorker` for the compile checks, never by hand::

    python -m app.compiler --platform cpu --memory-mb 16384 --cpu-devices 8
    python -m app.compiler --platform cuda              # live plans on a GPU host
    python -m app.compiler --platform cuda --describe   # one JSON line: the GPUs, then exit

It reads one JSON request per line on stdin and writes JSON lines on its own copy of
stdout (file descriptor 1 is pointed at stderr before JAX starts, so nothing libtpu or XLA
prints can corrupt the protocol; stderr goes to the service's log)::

    -> {"id", "target": {"kind": "tpu", "hardware", "topology", "slices"} | {"kind": "cpu"}
                         | {"kind": "gpu", ...},
        "axes": {name: size}, "device_ids": [...], "model", "optimizer", "global_batch",
        "hbm_bytes"}
    <- {"id", "phase": "lowering"} then {"id", "phase": "compiling"}
    <- {"id", "result": {...}}  or  {"id", "error": {"code", "detail"}}

One check at a time. The worker is its own process for three reasons: libtpu must never
touch the serving runtime's devices, a compile that crashes XLA costs only this process,
and its memory is capped (``--memory-mb``) so a compile that eats memory dies here with a
reason the supervisor reports, instead of the host's OOM killer choosing a victim.

Platforms (``--platform``, see :func:`environment` and :func:`memory_limits`):

- ``cpu``: ``JAX_PLATFORMS=cpu`` with ``--cpu-devices`` host devices (live CPU plans) and
  libtpu's topology descriptions (TPU hardware plans); the cap is ``RLIMIT_AS``.
- ``cuda`` (or ``rocm``): the host's own GPUs, the ones the serving runtime holds, for live
  plans on a GPU host. ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` and
  ``XLA_PYTHON_CLIENT_ALLOCATOR=platform``: the worker takes no memory pool, and whatever
  the compile allocates on a GPU (autotuning buffers; the step's own arrays are abstract
  ``ShapeDtypeStruct`` objects, never allocated) is freed when the compile ends, so it holds
  only its CUDA context. No ``RLIMIT_AS``: CUDA reserves address space the size of every
  GPU's memory and more at start, and fails under such a cap; the supervisor watches the
  worker's resident memory instead (``DATARAX_COMPILE_MEMORY_MB``).
  ``--describe`` starts the same backend with the allocator the runtime uses (so
  ``memory_stats()['bytes_limit']`` is the runtime's XLA pool, not preallocated here),
  answers ``{"platform", "jax_platform", "platform_version", "visible_devices",
  "devices": [{"id", "kind", "bytes_limit"}]}`` (or ``{"error"}``) and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import logging
import os
import resource
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("datarax.compiler")

_TOPOLOGY_CACHE: dict[tuple[str, str, int], Any] = {}
_TOPOLOGY_CACHE_SIZE = 4  # a 65,536-device topology holds ~100 MB of device objects


GPU_PLATFORMS = ("cuda", "rocm")
"""``--platform`` values that start the worker on the host's GPUs (JAX's platform names)."""


def environment(
    platform: str, cpu_devices: int, base: Mapping[str, str], *, describe: bool = False
) -> dict[str, str]:
    """The worker's environment before JAX starts, from ``base`` (not modified).

    ``cpu``: CPU backend only (TPU topologies come from libtpu's description, not from
    attached chips) with ``cpu_devices`` host devices, the ones live CPU plans name.
    ``cuda``/``rocm``: that GPU backend only, no preallocation and the platform allocator
    (``describe``: the runtime's allocator, still without preallocation). Either way no
    TPU metadata, and libtpu is allowed beside a runtime that holds its lock.
    """
    if platform != "cpu" and platform not in GPU_PLATFORMS:
        raise ValueError(f"unknown compile worker platform {platform!r}")
    env = dict(base)
    env["JAX_PLATFORMS"] = platform
    env["TPU_SKIP_MDS_QUERY"] = "1"
    # libtpu takes /tmp/libtpu_lockfile for its process; the worker only describes
    # topologies, so it must not be refused while a runtime or a test holds that lock.
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    if platform == "cpu":
        flags = [
            f
            for f in env.get("XLA_FLAGS", "").split()
            if not f.startswith("--xla_force_host_platform_device_count")
        ]
        flags.append(f"--xla_force_host_platform_device_count={cpu_devices}")
        env["XLA_FLAGS"] = " ".join(flags)
        return env
    # The serving runtime holds these GPUs: take no pool, hold nothing after a compile.
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    if not describe:
        env["XLA_PYTHON_CLIENT_ALLOCATOR"] = "platform"
    return env


def memory_limits(platform: str, memory_mb: int) -> dict[int, tuple[int, int]]:
    """``{resource.RLIMIT_*: (soft, hard)}`` the worker sets on itself.

    ``cpu``: ``RLIMIT_AS`` at ``memory_mb`` (0: none). GPU platforms: none; CUDA maps
    address ranges as large as the GPUs' memory (and the host's, for unified addressing)
    and fails to start under an address-space cap, so the supervisor caps the worker's
    resident memory instead (:meth:`app.workers.compile_worker.CompileWorker.watch_rss`).
    """
    if platform != "cpu" or memory_mb <= 0:
        return {}
    limit = memory_mb * 1024 * 1024
    return {resource.RLIMIT_AS: (limit, limit)}


def _environment(platform: str, cpu_devices: int, *, describe: bool = False) -> None:
    """Applies :func:`environment` to this process (before JAX starts)."""
    env = environment(platform, cpu_devices, os.environ, describe=describe)
    for name in set(os.environ) - set(env):
        del os.environ[name]
    os.environ.update(env)


def _cap_memory(platform: str, memory_mb: int) -> None:
    for which, limits in memory_limits(platform, memory_mb).items():
        resource.setrlimit(which, limits)


def _devices(target: dict[str, Any]) -> Any:
    import jax  # noqa: PLC0415 - after _environment

    from datarax.spmd.compile_step import tpu_topology_devices  # noqa: PLC0415

    if target["kind"] == "cpu":
        return jax.devices("cpu")
    if target["kind"] == "gpu":
        return jax.devices()  # the worker's only backend: JAX_PLATFORMS=cuda (or rocm)
    key = (target["hardware"], target["topology"], int(target.get("slices", 1)))
    if key not in _TOPOLOGY_CACHE:
        while len(_TOPOLOGY_CACHE) >= _TOPOLOGY_CACHE_SIZE:
            _TOPOLOGY_CACHE.pop(next(iter(_TOPOLOGY_CACHE)))
        _TOPOLOGY_CACHE[key] = tpu_topology_devices(*key)
    return _TOPOLOGY_CACHE[key]


GATE_ENV = "DATARAX_TEST_COMPILE_GATE"
"""Test hook, never set in production: a directory. At each of its gates (``start``,
before the worker says ready; ``lowering`` and ``compiling``, right after it reports
that phase) the worker writes ``<gate>.reached`` there and waits until ``<gate>.go``
exists, so a test holds a check in a phase of its choice for as long as it likes, with
no sleeps and no guessing (tests/e2e/test_compile_checks_server.py)."""

_GATE_POLL_S = 0.02


def _gate(name: str) -> None:
    folder = os.environ.get(GATE_ENV)
    if not folder:
        return
    gate = Path(folder)
    (gate / f"{name}.reached").touch()
    while not (gate / f"{name}.go").exists():
        time.sleep(_GATE_POLL_S)


def _quiet_signals() -> None:
    """SIGTERM ends the worker at once (the default action), SIGINT is ignored (the
    supervisor ends it: input closed, or SIGKILL to its process group). Again after each
    check: libtpu, loaded by the first TPU check, installs absl's failure signal handler,
    which turns a SIGTERM into a stack trace in the service's log."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def handle(request: dict[str, Any], send: Any) -> None:
    """Compiles one request's step and sends its phases and its result (or error)."""
    import numpy as np  # noqa: PLC0415

    from datarax.errors import PlanError  # noqa: PLC0415
    from datarax.spmd.compile_step import (  # noqa: PLC0415
        compile_train_step,
        mesh_from_ids,
    )

    cid = request.get("id")

    def on_phase(phase: str) -> None:
        send({"id": cid, "phase": phase})
        _gate(phase)

    try:
        axes = dict(request["axes"])
        ids = np.asarray(request["device_ids"], dtype=np.int64).reshape(tuple(axes.values()))
        mesh = mesh_from_ids(_devices(request["target"]), ids, list(axes))
        if request.get("serving"):  # a serving plan: one KV-cached decode step
            result = _decode_step(request, mesh, on_phase)
            send({"id": cid, "result": result})
            return
        result = compile_train_step(
            request["model"],
            mesh,
            int(request["global_batch"]),
            roles=request.get("roles"),
            optimizer=request.get("optimizer", "adam"),
            hbm_bytes=request.get("hbm_bytes"),
            on_phase=on_phase,
            context=request.get("context_parallel"),
            shard_over_data=bool(request.get("shard_over_data", False)),
            pipeline=request.get("pipeline"),
        )
    except PlanError as error:
        send({"id": cid, "error": {"code": error.code, "detail": str(error)}})
        return
    except MemoryError:
        send({"id": cid, "error": {"code": "compile_failed", "detail": _memory_detail()}})
        return
    except Exception as error:  # a bug or an XLA failure: report it, keep serving
        log.exception("compile check %s failed", cid)
        detail = f"{type(error).__name__}: {str(error)[:800]}"
        send({"id": cid, "error": {"code": "compile_failed", "detail": detail}})
        return
    send({"id": cid, "result": result})


def _decode_step(request: dict[str, Any], mesh: Any, on_phase: Any) -> dict[str, Any]:
    """A serving plan's decode step compiled (:mod:`datarax.spmd.compile_decode`): the
    compile's figures with ``weights_bytes`` and ``cache_bytes`` (per device)."""
    from datarax.spmd.compile_decode import compile_decode_step  # noqa: PLC0415

    serving = request["serving"]
    on_phase("lowering")
    on_phase("compiling")
    compiled = compile_decode_step(
        request["model"],
        mesh,
        request.get("roles") or {},
        int(serving["batch"]),
        int(serving["max_len"]),
        weight_dtype=serving.get("weight_dtype", "bfloat16"),
        hbm_bytes=request.get("hbm_bytes"),
    )
    return {**compiled.figures, "weights_bytes": compiled.weights_bytes,
            "cache_bytes": compiled.cache_bytes}  # fmt: skip


def _memory_detail() -> str:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return "the compile worker ran out of host memory"
    return (
        f"the compile worker ran out of memory (address-space cap {soft // 2**20} MiB, "
        "DATARAX_COMPILE_MEMORY_MB)"
    )


def describe_devices() -> dict[str, Any]:
    """This process's devices for the supervisor: ``{"platform", "jax_platform",
    "platform_version", "visible_devices", "devices": [{"id", "kind", "bytes_limit"}]}``;
    ``bytes_limit`` is XLA's pool on that device where the allocator reports one."""
    import jax  # noqa: PLC0415 - after _environment

    devices = jax.devices()
    out = []
    for device in devices:
        try:
            stats = device.memory_stats() or {}
        except Exception:  # a backend or allocator without memory statistics
            stats = {}
        limit = stats.get("bytes_limit")
        out.append(
            {
                "id": int(device.id),
                "kind": device.device_kind,
                "bytes_limit": int(limit) if limit else None,
            }
        )
    client = getattr(devices[0], "client", None)
    return {
        "platform": devices[0].platform,
        "jax_platform": os.environ.get("JAX_PLATFORMS"),
        "platform_version": str(getattr(client, "platform_version", "") or "") or None,
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")
        or os.environ.get("HIP_VISIBLE_DEVICES"),
        "devices": out,
    }


def _die_with_parent() -> None:
    """Best effort (Linux): SIGKILL this worker when the service dies, mid-compile too."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def main(argv: list[str] | None = None) -> int:
    _die_with_parent()
    _quiet_signals()
    parser = argparse.ArgumentParser(prog="python -m app.compiler")
    parser.add_argument(
        "--platform",
        choices=("cpu", *GPU_PLATFORMS),
        default="cpu",
        help="cpu: host devices and TPU topologies; cuda/rocm: the host's GPUs",
    )
    parser.add_argument("--memory-mb", type=int, default=0, help="RLIMIT_AS cap on cpu, 0 = none")
    parser.add_argument("--cpu-devices", type=int, default=8)
    parser.add_argument(
        "--describe", action="store_true", help="print the devices as one JSON line and exit"
    )
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    _environment(args.platform, args.cpu_devices, describe=args.describe)
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # whatever JAX, XLA or libtpu print goes to the log, not the protocol
    sys.stdout = sys.stderr
    _cap_memory(args.platform, args.memory_mb)

    def send(message: dict[str, Any]) -> None:
        try:
            text = json.dumps(message, allow_nan=False)
        except ValueError:  # a NaN or infinity in XLA's figures: JSON has none
            text = json.dumps(json.loads(json.dumps(message), parse_constant=lambda _: None))
        protocol.write(text + "\n")
        protocol.flush()

    if args.describe:
        try:
            send(describe_devices())
        except Exception as error:  # no GPU, a broken CUDA set-up, GPUs in exclusive mode
            log.exception("compile worker: the devices cannot be described")
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            if first:
                send({"error": f"{type(error).__name__}: {first[:600]}"})
            else:  # jax asserts when JAX_PLATFORMS names a backend that did not start
                send(
                    {
                        "error": f"JAX started no {args.platform!r} backend in the compile "
                        "worker (no visible GPU, or no JAX plugin for it)"
                    }
                )
            return 1
        return 0

    import jax  # noqa: PLC0415 - start JAX before "ready": checks then only compile

    import datarax.spmd.compile_step  # noqa: PLC0415, F401

    ready: dict[str, Any] = {"ready": True, "platform": args.platform}
    if args.platform != "cpu":
        ready["device_ids"] = [int(d.id) for d in jax.devices()]
    _gate("start")
    send(ready)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except ValueError:
            log.error("compile worker: unreadable request line dropped")
            continue
        if not isinstance(request, dict):  # valid JSON, but no request: nothing to answer
            log.error("compile worker: request line that is not a JSON object dropped")
            continue
        handle(request, send)
        _quiet_signals()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
