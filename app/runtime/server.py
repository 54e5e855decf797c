"""The runtime's command registry and its serve loop.

Commands live in :data:`COMMANDS`. A module adds its own with the :func:`command`
decorator; the runtime loads :data:`BUILTIN_MODULES` itself and any other module named with
``--command-module`` (``RuntimeClient(settings, command_modules=[...])``)::

    from app.runtime.server import command

    @command("session_create")
    def session_create(payload: dict, arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:
        ...
        return {"id": session_id}, {}

A handler returns ``(result, arrays)``: ``result`` JSON-able, ``arrays`` name -> numpy or
jax array. The error it raises becomes the reply's ``error`` (:func:`error_of`): an
:class:`app.core.errors.ServiceError` as raised; a library ``PlanError``/``MetricsError`` through
:func:`app.core.errors.from_library`; another ``ValueError`` as ``invalid_request``; anything
else as ``runtime_error``, logged with its traceback. The runtime keeps serving after any
of them.

Multi-host (:mod:`app.runtime.group`): the leader's runtime sends every command not
registered ``local=True`` to every other runtime of the group before it runs it, and waits
for their outcomes; a follower's runtime runs the leader's commands instead of its parent's.

Nothing here imports JAX: :mod:`app.runtime.__main__` imports this module before it sets
``XLA_FLAGS``.
"""

from __future__ import annotations

import importlib
import logging
import socket
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from app.core import channel
from app.core.channel import ArrayError
from app.core.errors import (
    ArrayNotAccepted,
    RuntimeDiverged,
    RuntimeFailed,
    ServiceError,
    UnknownCommand,
    from_library,
)
from app.core.logs import REQUEST_ID
from app.runtime import group as groups
from app.runtime.group import CommandGroup

log = logging.getLogger("datarax.runtime")

Handler = Callable[[dict[str, Any], dict[str, np.ndarray]], tuple[dict[str, Any], Mapping]]
Arrays = dict[str, np.ndarray]

COMMANDS: dict[str, Handler] = {}
"""Command name -> handler, for every command the runtime serves."""

LOCAL: set[str] = set()
"""Commands that run on this runtime only; every other one reaches every process of a
multi-host group (:mod:`app.runtime.group`)."""

BUILTIN_MODULES: tuple[str, ...] = (
    "app.runtime.calibration",
    "app.runtime.devices",
    "app.runtime.sessions",
    "app.runtime.steps",
)
"""Command modules every runtime loads: what the service needs."""


def command(name: str, *, local: bool = False) -> Callable[[Handler], Handler]:
    """Registers ``handler(payload, arrays) -> (result, arrays)`` as runtime command ``name``.

    Args:
      name: the command name clients send.
      local: run it on the leader's runtime only. By default a command reaches every
        runtime process of a multi-host group, in order, and all of them run it: anything
        that touches global devices (meshes, sessions, collectives) must.

    Raises:
      ValueError: ``name`` is already registered to another handler (two modules claiming
        one command).
    """

    def register(handler: Handler) -> Handler:
        if name in COMMANDS and COMMANDS[name] is not handler:
            raise ValueError(f"runtime command {name!r} is already registered")
        COMMANDS[name] = handler
        if local:
            LOCAL.add(name)
        return handler

    return register


def load_command_modules(modules: Iterable[str]) -> None:
    """Imports each module by name, which registers its commands.

    Raises:
      ImportError: a module that cannot be imported (the runtime exits: it would serve
        less than its client expects).
    """
    for module in modules:
        importlib.import_module(module)


# ------------------------------------------------------------------------------ replies


def error_of(exc: BaseException) -> ServiceError:
    """The :class:`~app.core.errors.ServiceError` a handler's exception answers as."""
    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, ArrayError):
        return ArrayNotAccepted(str(exc), code=exc.code)
    if isinstance(exc, ValueError):
        # PlanError and MetricsError carry a code of the table; any other is invalid_request.
        return from_library(exc)
    return RuntimeFailed(f"{type(exc).__name__}: {exc}")


def error_reply(request_id: Any, exc: BaseException) -> dict[str, Any]:
    """The reply header of a failed request."""
    return {"id": request_id, "ok": False, "error": error_of(exc).to_reply()}


def _resolve(header: dict[str, Any]) -> tuple[Handler, dict[str, Any]]:
    """The handler and payload of a request; raises what the error reply should say."""
    name = header.get("command")
    handler = COMMANDS.get(name) if isinstance(name, str) else None
    if handler is None:
        raise UnknownCommand(
            f"runtime command {name!r} is not served; known: {', '.join(sorted(COMMANDS))}"
        )
    payload = header.get("payload") or {}
    if not isinstance(payload, dict):
        raise ValueError(f"payload must be a JSON object, got {type(payload).__name__}")
    return handler, payload


def execute(header: dict[str, Any], arrays: Arrays | ArrayError) -> tuple[dict[str, Any], Mapping]:
    """Runs one request; returns the reply header and its arrays.

    Never raises for a handler's error: it becomes the reply's ``error``.
    """
    request_id = header.get("id")
    # The HTTP request this command serves: every line logged while it runs carries it.
    http_request_id = header.get("request_id")
    token = REQUEST_ID.set(http_request_id if isinstance(http_request_id, str) else None)
    try:
        if isinstance(arrays, ArrayError):
            raise arrays
        handler, payload = _resolve(header)
        result, out_arrays = handler(payload, arrays)
        return {"id": request_id, "ok": True, "result": result}, out_arrays
    except Exception as exc:  # the runtime outlives any single command
        if not isinstance(exc, ServiceError | ValueError):
            log.exception("runtime command %r failed", header.get("command"))
        return error_reply(request_id, exc), {}
    finally:
        REQUEST_ID.reset(token)


def _frame(reply: dict[str, Any], out_arrays: Mapping) -> list:
    try:
        return channel.encode_message(reply, out_arrays)
    except Exception as exc:  # a handler's unsendable result is its error, not the loop's
        log.exception("runtime command reply could not be framed")
        return channel.encode_message(error_reply(reply.get("id"), exc))


def handle(header: dict[str, Any], arrays: Arrays | ArrayError) -> list:
    """Runs one request; returns the framed reply. Never raises for a handler's error."""
    return _frame(*execute(header, arrays))


# ----------------------------------------------------------------------------- groups


def fans_out(header: dict[str, Any], arrays: Arrays | ArrayError) -> bool:
    """Whether a request must reach every process of a group: a valid, non-local command."""
    if isinstance(arrays, ArrayError) or header.get("command") in LOCAL:
        return False
    try:
        _resolve(header)
    except (ServiceError, ValueError):
        return False  # refused alike everywhere: nothing to send
    return True


def handle_in_group(
    group: CommandGroup, header: dict[str, Any], arrays: Arrays | ArrayError
) -> tuple[list, bool]:
    """The leader's :func:`handle` in a multi-host group: sends the command to every
    follower first, runs it, and waits for their outcomes.

    Returns:
      The framed reply, and whether the group is still consistent (False: exit now).
    """
    if isinstance(arrays, ArrayError) or not fans_out(header, arrays):
        return handle(header, arrays), True
    seq = group.publish(header, arrays)
    reply, out_arrays = execute(header, arrays)
    problems = group.collect_acks(seq, groups.outcome_of(reply))
    if not problems:
        return _frame(reply, out_arrays), True
    name = header.get("command")
    log.error("runtime processes diverged on %r: %s", name, "; ".join(problems))
    error = RuntimeDiverged(
        f"command {name!r}: {'; '.join(problems)}; the runtime group is restarting"
    )
    return channel.encode_message(error_reply(header.get("id"), error)), False


# ------------------------------------------------------------------------------- loop


def serve(sock: socket.socket, group: CommandGroup | None = None) -> int:
    """Answers requests one at a time, in arrival order, until the parent closes the channel.

    In a multi-host group the leader fans every non-local command out to all processes,
    and a follower runs the leader's commands instead of its parent's (it answers only
    its parent's handshake).

    Args:
      sock: the blocking socket to the parent (the HTTP process or a follower host).
      group: this runtime's multi-host group; ``None`` for a single process.

    Returns:
      The exit status: 0 when the channel closed; :data:`app.runtime.group.EXIT_DIVERGED`
      when the group's processes disagreed about a command; 1 when a follower lost the
      group.

    Raises:
      app.core.channel.ChannelError: the parent's stream is corrupt.
    """
    if group is not None and not group.is_leader:
        return groups.follow(sock, group, execute, LOCAL | {"devices"})
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
            return groups.EXIT_DIVERGED
