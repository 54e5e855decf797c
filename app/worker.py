"""The runtime process: owns the JAX devices and runs device commands one at a time.

Started by :class:`app.runtime.RuntimeClient` as::

    python -m app.worker --fd N --parent-pid P --settings-json '{...}' [--command-module M ...]

It talks to the HTTP process over the socket ``N`` (a ``socketpair`` end passed with
``pass_fds``; stdout stays free for JAX's logs) using the framing of :mod:`app.channel`,
and exits when that socket reaches EOF or its parent dies, so it never outlives the service.

Commands live in :data:`COMMANDS`. Another module adds its own with the decorator and is
loaded in the runtime with ``--command-module`` (``RuntimeClient(command_modules=...)``)::

    from app.worker import command

    @command("session_create")
    def session_create(payload: dict, arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:
        ...
        return {"id": session_id}, {}

A handler returns ``(result, arrays)``: ``result`` JSON-able, ``arrays`` name -> numpy or jax
array. Errors it raises become error replies: :class:`app.channel.CommandError` as given, a
``ValueError`` as 422 (with the exception's ``code`` attribute when it has one, such as
``PlanError``; ``invalid_request`` otherwise), anything else as 500 ``runtime_error``. The
runtime keeps serving after any of them.

Multi-host (settings with a coordinator, or ``distributed``): before anything touches a
device the runtime joins JAX's distributed runtime (:func:`app.multihost.join_group`).
Process 0's runtime then sends every command not registered ``local=True`` to every other
runtime process through the coordination service and waits for them; the others run those
commands instead of their parent's (see :mod:`app.multihost`). A runtime of a group ends
with ``os._exit``: a normal interpreter shutdown would wait for the other processes.

Nothing here imports JAX at module level: :func:`main` sets ``XLA_FLAGS`` and
``JAX_PLATFORMS`` first, and importing this module (from the HTTP process, for
:func:`worker_environment`) stays cheap.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import logging
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from app import channel
from app.channel import ArrayError, ChannelError, CommandError
from app.settings import Settings

if TYPE_CHECKING:
    from app.multihost import CommandGroup

log = logging.getLogger("datarax.runtime")

Handler = Callable[[dict[str, Any], dict[str, np.ndarray]], tuple[dict[str, Any], Mapping]]

COMMANDS: dict[str, Handler] = {}
"""Command name -> handler, for every command the runtime serves."""

TEST_ONLY: set[str] = set()
"""Commands served only when ``settings.test_commands`` is on."""

LOCAL: set[str] = set()
"""Commands that run on this runtime only; every other one reaches every process of a
multi-host group (:mod:`app.multihost`)."""

_settings: Settings | None = None
_started = time.monotonic()

_DEVICE_COUNT_FLAG = re.compile(r"\s*--xla_force_host_platform_device_count=\S*")


def command(
    name: str, *, test_only: bool = False, local: bool = False
) -> Callable[[Handler], Handler]:
    """Registers ``handler(payload, arrays) -> (result, arrays)`` as runtime command ``name``.

    Args:
      name: the command name clients send.
      test_only: serve it only when ``settings.test_commands`` is on (``DATARAX_TEST_COMMANDS``).
      local: run it on the leader's runtime only. By default a command reaches every
        runtime process of a multi-host group, in order, and all of them run it: anything
        that touches global devices (meshes, sessions, collectives) must.

    Raises:
      ValueError: ``name`` is already registered (two modules claiming one command).
    """

    def register(handler: Handler) -> Handler:
        if name in COMMANDS and COMMANDS[name] is not handler:
            raise ValueError(f"runtime command {name!r} is already registered")
        COMMANDS[name] = handler
        if test_only:
            TEST_ONLY.add(name)
        if local:
            LOCAL.add(name)
        return handler

    return register


def settings() -> Settings:
    """The settings this runtime process was started with."""
    if _settings is None:
        raise RuntimeError("runtime settings are only available inside the runtime process")
    return _settings


def worker_environment(settings: Settings, base: Mapping[str, str]) -> dict[str, str]:
    """The environment a runtime process needs, derived from ``base`` (usually os.environ).

    Simulates ``settings.cpu_devices`` host devices (``XLA_FLAGS``: any existing device count
    is replaced, other flags kept; the flag only affects the CPU backend, so it is harmless
    on GPU/TPU hosts) and sets ``JAX_PLATFORMS`` when ``settings.platforms`` is set.
    """
    env = dict(base)
    flags = _DEVICE_COUNT_FLAG.sub("", env.get("XLA_FLAGS", "")).strip()
    count = f"--xla_force_host_platform_device_count={settings.cpu_devices}"
    env["XLA_FLAGS"] = f"{flags} {count}".strip()
    if settings.platforms:
        env["JAX_PLATFORMS"] = settings.platforms
    return env


# ---------------------------------------------------------------------------------- commands


@command("ping", local=True)
def ping(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:  # noqa: ARG001
    """Liveness: ``{"pid", "uptime_s"}``."""
    return {"pid": os.getpid(), "uptime_s": time.monotonic() - _started}, {}


def host_capacity_bytes() -> int:
    """Physical memory, or the container's limit (cgroup v2 or v1) when lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in (
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ):
        try:
            raw = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if raw.isdigit():  # "max" (v2) means no limit; v1 writes a huge number instead
            total = min(total, int(raw))
    return total


def memory_budgets(settings: Settings) -> dict[str, int | None]:
    """Bytes training sessions may plan to hold (see ``app.training``): ``host`` for this
    host's CPU devices together, ``device`` for each accelerator (the smallest local
    ``bytes_limit``, which is already XLA's share of the device; None without one).
    ``DATARAX_MEMORY_BUDGET_MB`` replaces both; else ``DATARAX_MEMORY_FRACTION`` of them."""
    import jax

    if settings.memory_budget_mb is not None:
        fixed = int(settings.memory_budget_mb * 2**20)
        return {"host": fixed, "device": fixed}
    limits = []
    for device in jax.local_devices():
        if device.platform == "cpu":
            continue
        try:
            stats = device.memory_stats() or {}
        except Exception:  # a backend without memory statistics
            stats = {}
        limits.append(int(stats.get("bytes_limit") or host_capacity_bytes()))
    fraction = settings.memory_fraction
    return {
        "host": int(host_capacity_bytes() * fraction),
        "device": int(min(limits) * fraction) if limits else None,
    }


@command("devices")
def devices(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:  # noqa: ARG001
    """Every global device: ``{"platform", "process_count", "process_index", "devices",
    "memory_budget"}``."""
    import jax

    all_devices = jax.devices()
    return {
        "platform": all_devices[0].platform,
        "process_count": jax.process_count(),
        "process_index": jax.process_index(),
        "memory_budget": memory_budgets(settings()),
        "devices": [
            {
                "id": d.id,
                "kind": d.device_kind,
                "platform": d.platform,
                "process_index": d.process_index,
                "coords": _coords(d),
            }
            for d in all_devices
        ],
    }, {}


def _coords(device: Any) -> list[int] | None:
    coords = getattr(device, "coords", None)
    return None if coords is None else [int(c) for c in coords]


@command("mesh_grid")
def mesh_grid(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:  # noqa: ARG001
    """Device ids of a live mesh in JAX's mesh order.

    Payload ``{"axes": {name: size}}`` (ordered; one size may be -1). Answers
    ``{"axes": resolved sizes, "device_grid": nested lists of ids, shaped like the mesh,
    "process_index": {str(id): process index}, "platform"}``. A
    :class:`~datarax.distributed.planning.PlanError` (``not_enough_devices``, ...) becomes a
    422 reply carrying its code.
    """
    axes = payload.get("axes")
    if not isinstance(axes, dict) or not axes:
        raise ValueError(f"payload 'axes' must be a non-empty object name -> size, got {axes!r}")
    from datarax.distributed.device_mesh import DeviceMeshManager

    mesh = DeviceMeshManager.create_device_mesh(axes)
    grid = np.vectorize(lambda d: d.id, otypes=[np.int64])(mesh.devices)
    return {
        "axes": {name: int(size) for name, size in mesh.shape.items()},
        "device_grid": grid.tolist(),
        "process_index": {str(d.id): d.process_index for d in mesh.devices.flat},
        "platform": mesh.devices.flat[0].platform,
    }, {}


@command("echo", test_only=True, local=True)
def echo(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """Test only: answers the payload and arrays it was sent."""
    return payload, arrays


@command("sleep", test_only=True, local=True)
def sleep(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:  # noqa: ARG001
    """Test only: blocks the runtime for ``payload["seconds"]``; answers CLOCK_MONOTONIC times."""
    seconds = payload.get("seconds", 0)
    if not isinstance(seconds, int | float) or seconds < 0:
        raise ValueError(f"'seconds' must be a non-negative number, got {seconds!r}")
    started = time.monotonic()
    time.sleep(seconds)
    return {"started": started, "finished": time.monotonic(), "tag": payload.get("tag")}, {}


@command("crash", test_only=True, local=True)
def crash(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:  # noqa: ARG001
    """Test only: dies like a JAX abort (``{"how": "abort"}``) or a hard exit (default)."""
    if payload.get("how") == "abort":
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file in the test directory
        os.abort()
    os._exit(int(payload.get("exit_code", 70)))


# ------------------------------------------------------------------------------------- loop


def _error_reply(request_id: Any, exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, CommandError):
        error = exc
    elif isinstance(exc, ValueError):
        code = getattr(exc, "code", None)
        error = CommandError(
            422, code if isinstance(code, str) else "invalid_request", "Invalid request", str(exc)
        )
    else:
        error = CommandError(500, "runtime_error", "Runtime error", f"{type(exc).__name__}: {exc}")
    return {"id": request_id, "ok": False, "error": error.to_json()}


def _resolve(header: dict[str, Any], *, trusted: bool = False) -> tuple[Handler, dict]:
    """The handler and payload of a request; raises what the error reply should say."""
    name = header.get("command")
    handler = COMMANDS.get(name) if isinstance(name, str) else None
    if handler is None or (name in TEST_ONLY and not trusted and not settings().test_commands):
        raise CommandError(400, "unknown_command", "Unknown runtime command", repr(name))
    payload = header.get("payload") or {}
    if not isinstance(payload, dict):
        raise ValueError(f"payload must be a JSON object, got {type(payload).__name__}")
    return handler, payload


def execute(
    header: dict[str, Any],
    arrays: dict[str, np.ndarray] | ArrayError,
    *,
    trusted: bool = False,
) -> tuple[dict[str, Any], Mapping]:
    """Runs one request; returns the reply header and its arrays. Never raises for a
    handler's error. ``trusted``: the leader already admitted it (a multi-host follower
    runs what the leader sends, whatever its own ``test_commands``)."""
    request_id = header.get("id")
    name = header.get("command")
    try:
        if isinstance(arrays, ArrayError):
            raise arrays
        handler, payload = _resolve(header, trusted=trusted)
        result, out_arrays = handler(payload, arrays)
        return {"id": request_id, "ok": True, "result": result}, out_arrays
    except Exception as exc:  # the runtime outlives any single command
        if not isinstance(exc, CommandError | ValueError):
            log.exception("runtime command %r failed", name)
        return _error_reply(request_id, exc), {}


def _frame(reply: dict[str, Any], out_arrays: Mapping) -> list:
    try:
        return channel.encode_message(reply, out_arrays)
    except Exception as exc:  # a handler's unsendable result is its error, not ours
        log.exception("runtime command reply could not be framed")
        return channel.encode_message(_error_reply(reply.get("id"), exc))


def handle(header: dict[str, Any], arrays: dict[str, np.ndarray] | ArrayError) -> list:
    """Runs one request; returns the framed reply. Never raises for a handler's error."""
    return _frame(*execute(header, arrays))


def _fans_out(header: dict[str, Any], arrays: dict[str, np.ndarray] | ArrayError) -> bool:
    """Whether a request must reach every process: a valid, non-local command."""
    if isinstance(arrays, ArrayError) or header.get("command") in LOCAL:
        return False
    try:
        _resolve(header)
    except (CommandError, ValueError):
        return False  # refused alike everywhere: nothing to send
    return True


def handle_in_group(
    group: CommandGroup, header: dict[str, Any], arrays: dict[str, np.ndarray] | ArrayError
) -> tuple[list, bool]:
    """The leader's :func:`handle` in a multi-host group (:class:`app.multihost.CommandGroup`):
    sends the command to every follower first, runs it, and waits for their acks.

    Returns:
      The framed reply, and whether the group is still consistent (False: exit now).
    """
    from app.multihost import outcome_of

    if not _fans_out(header, arrays):
        return handle(header, arrays), True
    seq = group.publish(header, arrays)
    reply, out_arrays = execute(header, arrays)
    problems = group.collect_acks(seq, outcome_of(reply))
    if not problems:
        return _frame(reply, out_arrays), True
    name = header.get("command")
    log.error("runtime processes diverged on %r: %s", name, "; ".join(problems))
    error = CommandError(
        500,
        "runtime_diverged",
        "Runtime processes diverged",
        f"command {name!r}: {'; '.join(problems)}; the runtime group is restarting",
    )
    return channel.encode_message(_error_reply(header.get("id"), error)), False


def serve(sock: socket.socket, group: CommandGroup | None = None) -> int:
    """Answers requests one at a time, in arrival order, until the parent closes the channel.

    In a multi-host group (:mod:`app.multihost`) the leader fans every non-local command
    out to all processes, and a follower runs the leader's commands instead of its
    parent's (it answers only its parent's handshake).

    Returns:
      The exit status: 0 when the channel closed; ``app.multihost.EXIT_DIVERGED`` when
      the group's processes disagreed about a command; 1 when a follower lost the group.
    """
    if group is not None and not group.is_leader:
        from app.multihost import follow

        return follow(sock, group, lambda h, a: execute(h, a, trusted=True), LOCAL | {"devices"})
    while True:
        try:
            header, arrays = channel.recv_message(sock)
        except EOFError:
            return 0
        if group is None:
            channel.send_message(sock, handle(header, arrays))
            continue
        reply, consistent = handle_in_group(group, header, arrays)
        channel.send_message(sock, reply)
        if not consistent:
            from app.multihost import EXIT_DIVERGED

            return EXIT_DIVERGED


def _die_with_parent(parent_pid: int | None) -> None:
    """Best effort: SIGKILL this process when the parent dies (Linux ``PR_SET_PDEATHSIG``)."""
    if sys.platform.startswith("linux"):
        try:
            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(0)  # the parent died before prctl took effect


def main(argv: list[str] | None = None) -> int:
    global _settings
    parser = argparse.ArgumentParser(
        prog="python -m app.worker", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--fd", type=int, required=True, help="connected socket to the parent")
    parser.add_argument("--parent-pid", type=int, default=None)
    parser.add_argument("--settings-json", default=None, help="Settings as JSON (else from env)")
    parser.add_argument("--command-module", action="append", default=[], help="module to import")
    args = parser.parse_args(argv)

    _die_with_parent(args.parent_pid)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s runtime[%(process)d] %(message)s")
    _settings = Settings(**json.loads(args.settings_json)) if args.settings_json else Settings()
    # Before anything imports jax: the device count and platform are fixed at backend start.
    os.environ.update(worker_environment(_settings, os.environ))
    group = None
    modules = list(args.command_module)
    if _settings.multihost:
        from app import multihost

        # Joins JAX's distributed runtime before any device use; followers load the
        # leader's command modules so that every process knows every command.
        group = multihost.join_group(_settings, modules)
        if not group.is_leader:
            modules = multihost.leader_modules(group)
    for module in modules:
        importlib.import_module(module)

    sock = socket.socket(fileno=args.fd)
    sock.setblocking(True)
    status = 0
    try:
        status = serve(sock, group)
    except ChannelError as exc:
        log.error("corrupt request stream, exiting: %s", exc)
        status = 2
    except (BrokenPipeError, ConnectionResetError):
        status = 0
    finally:
        sock.close()
    if group is not None:
        multihost.exit_now(status)  # not through Python's shutdown: see exit_now
    return status


if __name__ == "__main__":
    # Run the copy imported as ``app.worker``, not ``__main__``: command modules register
    # into ``app.worker.COMMANDS`` and must find the built-in commands in the same dict.
    from app import worker

    sys.exit(worker.main())
