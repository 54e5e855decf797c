"""``python -m app.compiler``: the compile worker, started and supervised by
:class:`app.services.compile_checks.CompileChecks`, never by hand::

    python -m app.compiler --memory-mb 16384 --cpu-devices 8

It reads one JSON request per line on stdin and writes JSON lines on its own copy of
stdout (file descriptor 1 is pointed at stderr before JAX starts, so nothing libtpu or XLA
prints can corrupt the protocol; stderr goes to the service's log)::

    -> {"id", "target": {"kind": "tpu", "hardware", "topology", "slices"} | {"kind": "cpu"},
        "axes": {name: size}, "device_ids": [...], "model", "optimizer", "global_batch",
        "hbm_bytes"}
    <- {"id", "phase": "lowering"} then {"id", "phase": "compiling"}
    <- {"id", "result": {...}}  or  {"id", "error": {"code", "detail"}}

One check at a time. The worker is its own process for three reasons: libtpu must never
touch the serving runtime's devices, a compile that crashes XLA costs only this process,
and its address space is capped (``RLIMIT_AS``, ``--memory-mb``) so a compile that eats
memory dies here with a reason the supervisor reports, instead of the host's OOM killer
choosing a victim.
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
from typing import Any

log = logging.getLogger("datarax.compiler")

_TOPOLOGY_CACHE: dict[tuple[str, str, int], Any] = {}
_TOPOLOGY_CACHE_SIZE = 4  # a 65,536-device topology holds ~100 MB of device objects


def _environment(cpu_devices: int) -> None:
    """Before JAX starts: CPU backend only (TPU topologies come from libtpu's description,
    not from attached chips), the host devices live plans name, and no TPU metadata."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["TPU_SKIP_MDS_QUERY"] = "1"
    # libtpu takes /tmp/libtpu_lockfile for its process; the worker only describes
    # topologies, so it must not be refused while a runtime or a test holds that lock.
    os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    flags = [
        f
        for f in os.environ.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
    ]
    flags.append(f"--xla_force_host_platform_device_count={cpu_devices}")
    os.environ["XLA_FLAGS"] = " ".join(flags)


def _cap_memory(memory_mb: int) -> None:
    if memory_mb > 0:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _devices(target: dict[str, Any]) -> Any:
    import jax  # noqa: PLC0415 - after _environment

    from datarax.distributed.compile_step import tpu_topology_devices  # noqa: PLC0415

    if target["kind"] == "cpu":
        return jax.devices("cpu")
    key = (target["hardware"], target["topology"], int(target.get("slices", 1)))
    if key not in _TOPOLOGY_CACHE:
        while len(_TOPOLOGY_CACHE) >= _TOPOLOGY_CACHE_SIZE:
            _TOPOLOGY_CACHE.pop(next(iter(_TOPOLOGY_CACHE)))
        _TOPOLOGY_CACHE[key] = tpu_topology_devices(*key)
    return _TOPOLOGY_CACHE[key]


def handle(request: dict[str, Any], send: Any) -> None:
    """Compiles one request's step and sends its phases and its result (or error)."""
    import numpy as np  # noqa: PLC0415

    from datarax.distributed.compile_step import (  # noqa: PLC0415
        compile_train_step,
        mesh_from_ids,
    )
    from datarax.distributed.planning import PlanError  # noqa: PLC0415

    cid = request.get("id")
    try:
        axes = dict(request["axes"])
        ids = np.asarray(request["device_ids"], dtype=np.int64).reshape(tuple(axes.values()))
        mesh = mesh_from_ids(_devices(request["target"]), ids, list(axes))
        result = compile_train_step(
            request["model"],
            mesh,
            int(request["global_batch"]),
            roles=request.get("roles"),
            optimizer=request.get("optimizer", "adam"),
            hbm_bytes=request.get("hbm_bytes"),
            on_phase=lambda phase: send({"id": cid, "phase": phase}),
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


def _memory_detail() -> str:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    cap = "no cap" if soft == resource.RLIM_INFINITY else f"{soft // 2**20} MiB"
    return (
        f"the compile worker ran out of memory (address-space cap {cap}, DATARAX_COMPILE_MEMORY_MB)"
    )


def _die_with_parent() -> None:
    """Best effort (Linux): SIGKILL this worker when the service dies, mid-compile too."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def main(argv: list[str] | None = None) -> int:
    _die_with_parent()
    parser = argparse.ArgumentParser(prog="python -m app.compiler")
    parser.add_argument("--memory-mb", type=int, default=0, help="RLIMIT_AS cap, 0 = none")
    parser.add_argument("--cpu-devices", type=int, default=8)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    _environment(args.cpu_devices)
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # whatever JAX, XLA or libtpu print goes to the log, not the protocol
    sys.stdout = sys.stderr
    _cap_memory(args.memory_mb)
    import jax  # noqa: PLC0415, F401 - start JAX before "ready": checks then only compile

    import datarax.distributed.compile_step  # noqa: PLC0415, F401

    def send(message: dict[str, Any]) -> None:
        try:
            text = json.dumps(message, allow_nan=False)
        except ValueError:  # a NaN or infinity in XLA's figures: JSON has none
            text = json.dumps(json.loads(json.dumps(message), parse_constant=lambda _: None))
        protocol.write(text + "\n")
        protocol.flush()

    send({"ready": True})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except ValueError:
            log.error("compile worker: unreadable request line dropped")
            continue
        handle(request, send)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
