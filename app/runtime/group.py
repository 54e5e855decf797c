"""Multi-host fan-out: one JAX distributed runtime across processes, driven by process 0.

Every runtime process of a group runs every device command, in the same order, so that
the processes enter JAX's collectives together. The commands travel through the key-value
store of JAX's coordination service, which lives in the leader's (process 0's) runtime:

1. At start the leader's runtime joins the group (``jax.distributed.initialize`` returns
   once all N processes have connected), draws a random *epoch* and writes the extra
   command modules it loaded to ``datarax/modules`` and the epoch to ``datarax/epoch``.
   Followers wait for the epoch, load the same modules and register once under
   ``datarax/{epoch}/joined/{pid}``: a second registration means a restarted process in
   a group that is still alive, which cannot work (JAX's collectives would still expect
   the old one), so it exits (:data:`EXIT_LATE_JOINER`) and its supervisor retries.
2. For each device command from the HTTP process, the leader's runtime writes the
   request (a frame of :mod:`app.core.channel`: JSON header plus array bytes, never pickle)
   to ``datarax/{epoch}/cmd/{seq}``, runs the handler itself, then waits for every
   follower's ``datarax/{epoch}/ack/{seq}/{pid}`` before it answers and deletes both.
   Followers take ``cmd/0``, ``cmd/1``, ... in order with blocking gets (one-second
   slices, so they also notice their parent closing the channel), run the same handler,
   discard the result and ack ``ok`` or the error code. Every command therefore reaches
   every runtime exactly once and in order.
3. Commands registered with ``local=True`` (``ping``, test tools) run on the leader only.
   An ack that disagrees with the leader's own outcome (one process failed where another
   did not) means the processes' states diverged: the leader answers 500
   ``runtime_diverged`` and exits (:data:`EXIT_DIVERGED`), which restarts the whole group.

Failure semantics (JAX 0.12, measured on CPU):

- A process that stops heartbeating (a crash, ``kill -9``, a lost host) makes the
  coordination service abort every other runtime (SIGABRT in C++) within
  ``DATARAX_HEARTBEAT_S`` (JAX's ``heartbeat_timeout_seconds`` is set one second below it:
  :func:`jax_heartbeat_timeout_s`). The leader's HTTP process sees its runtime die and
  answers 503 ``worker_lost`` until the group is back.
- When the leader's runtime dies, the coordination service goes with it and followers
  abort within milliseconds. Supervisors restart their runtimes with backoff; the new
  group forms when all N runtimes have initialised, within
  ``DATARAX_DISTRIBUTED_INIT_TIMEOUT_S`` or the runtime exits and retries. A restarted
  follower that reaches the old coordinator is refused (new incarnation) and takes the
  group down with it, so the group always restarts as a whole; sessions are lost.
- ``jax_enable_recoverability`` stays off: with it a collective whose peer died can hang
  forever instead of aborting. The preemption notifier is off so SIGTERM stops a runtime.
- A process that is alive but stuck shows as the leader's command running past
  ``DATARAX_STEP_TIMEOUT_S``: the leader's runtime is killed (504) and the group restarts.

Nothing here imports JAX at module level (the server imports this module before the
runtime's environment is set).
"""

from __future__ import annotations

import json
import logging
import math
import os
import select
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.core import channel
from app.core.channel import ArrayError
from app.core.errors import NotLeader
from app.core.settings import Settings

log = logging.getLogger("datarax.multihost")

KEY_ROOT = "datarax"
POLL_MS = 1000
"""Slice of a follower's blocking get: how soon it notices its parent closing the channel."""

EXIT_LATE_JOINER = 75
"""A follower that registered twice in one epoch (it restarted into a live group)."""

EXIT_DIVERGED = 76
"""The leader saw the processes disagree about a command."""

Arrays = dict[str, np.ndarray]
Execute = Callable[[dict[str, Any], Arrays | ArrayError], tuple[dict, Any]]


def process_id_of(settings: Settings) -> int | None:
    """This host's process id: ``settings.process_id``, else what JAX's cluster detection
    says (``DATARAX_DISTRIBUTED=true``), else ``None`` (single process)."""
    if settings.process_id is not None:
        return settings.process_id
    if not settings.multihost:
        return None
    from datarax.spmd.multihost import detect_process_id

    return detect_process_id()


def jax_heartbeat_timeout_s(heartbeat_s: float) -> int:
    """JAX's ``heartbeat_timeout_seconds`` for a lost-peer detection bound of
    ``heartbeat_s``: one second less (at least 1).

    Measured with jax 0.12 on CPU, the survivors abort between about ``timeout - 3`` and
    ``timeout + 1`` seconds after a peer's ``kill -9`` (the service checks about once a
    second), so one second of headroom keeps ``/health/ready`` within ``heartbeat_s``.
    """
    return max(1, math.ceil(heartbeat_s) - 1)


@dataclass
class CommandGroup:
    """This runtime's place in the group and the fan-out protocol (module docstring).

    Attributes:
      client: JAX's coordination-service client.
      process_id: this process; 0 is the leader.
      num_processes: processes in the group.
      epoch: the leader's random id for this incarnation of the group.
      ack_timeout_s: how long the leader waits for followers to finish a command.
      seq: the next command's sequence number.
    """

    client: Any
    process_id: int
    num_processes: int
    epoch: str
    ack_timeout_s: float
    seq: int = 0

    @property
    def is_leader(self) -> bool:
        return self.process_id == 0

    def _key(self, *parts: Any) -> str:
        return "/".join((KEY_ROOT, self.epoch, *(str(p) for p in parts)))

    # leader
    def publish(self, header: dict[str, Any], arrays: Arrays) -> int:
        """Writes the next command for the followers; returns its sequence number."""
        seq, self.seq = self.seq, self.seq + 1
        parts = channel.encode_message(
            {"command": header.get("command"), "payload": header.get("payload") or {}}, arrays
        )
        self.client.key_value_set_bytes(self._key("cmd", seq), b"".join(parts))
        return seq

    def collect_acks(self, seq: int, outcome: str) -> list[str]:
        """Waits for every follower's ack of ``seq``; returns the disagreements (empty: all
        did what the leader did). Deletes the command and its acks."""
        from jax.errors import JaxRuntimeError

        deadline = time.monotonic() + self.ack_timeout_s
        problems = []
        for pid in range(1, self.num_processes):
            remaining_ms = max(1, int((deadline - time.monotonic()) * 1000))
            try:
                got = self.client.blocking_key_value_get(self._key("ack", seq, pid), remaining_ms)
            except JaxRuntimeError as exc:
                problems.append(f"process {pid} did not finish command {seq}: {exc}")
                continue
            if got != outcome:
                problems.append(f"process {pid} answered {got!r} where process 0 had {outcome!r}")
        self.client.key_value_delete(self._key("cmd", seq))
        self.client.key_value_delete(self._key("ack", seq))
        return problems

    # follower
    def next_command(self, timeout_ms: int) -> bytes | None:
        """The next command's frame, or ``None`` when none arrived within ``timeout_ms``."""
        from jax.errors import JaxRuntimeError

        try:
            return self.client.blocking_key_value_get_bytes(self._key("cmd", self.seq), timeout_ms)
        except JaxRuntimeError as exc:
            if "DEADLINE_EXCEEDED" in str(exc):
                return None
            raise

    def ack(self, outcome: str) -> None:
        self.client.key_value_set(self._key("ack", self.seq, self.process_id), outcome)
        self.seq += 1


def outcome_of(reply: dict[str, Any]) -> str:
    """What an ack says about a reply header: ``ok`` or ``error:<code>``."""
    if reply.get("ok"):
        return "ok"
    return f"error:{(reply.get('error') or {}).get('code', 'runtime_error')}"


def join_group(settings: Settings, command_modules: Iterable[str]) -> CommandGroup | None:
    """Joins the JAX group described by ``settings`` (inside a runtime process).

    Must run before anything touches a device; blocks until every process has joined
    (at most ``settings.distributed_init_timeout_s``, then JAX aborts the process). The
    leader announces the epoch and its extra ``command_modules``; a follower waits for them
    (it loads :func:`leader_modules`) and exits if it already joined this epoch.

    Returns:
      ``None`` for a single-process service; else this process's :class:`CommandGroup`.
    """
    if not settings.multihost:
        return None
    from datarax.spmd.multihost import coordination_client, initialize_distributed

    initialize_distributed(
        settings.coordinator,
        settings.num_processes,
        process_id_of(settings),  # what the parent decided, not a new guess
        auto=settings.distributed,
        heartbeat_timeout_s=jax_heartbeat_timeout_s(settings.heartbeat_s),
        init_timeout_s=settings.distributed_init_timeout_s,
        coordinator_bind_address=settings.coordinator_bind_address,
    )
    import jax

    client = coordination_client()
    pid, count = jax.process_index(), jax.process_count()
    timeout_ms = int(settings.distributed_init_timeout_s * 1000)
    if pid == 0:
        epoch = uuid.uuid4().hex
        client.key_value_set(f"{KEY_ROOT}/modules", json.dumps(list(command_modules)))
        client.key_value_set(f"{KEY_ROOT}/epoch", epoch)
    else:
        epoch = client.blocking_key_value_get(f"{KEY_ROOT}/epoch", timeout_ms)
        if client.key_value_increment(f"{KEY_ROOT}/{epoch}/joined/{pid}", 1) != 1:
            log.error("process %d joined epoch %s twice: exiting to restart the group", pid, epoch)
            exit_now(EXIT_LATE_JOINER)
    log.info("process %d of %d joined group epoch %s", pid, count, epoch)
    return CommandGroup(client, pid, count, epoch, settings.step_timeout_s)


def leader_modules(group: CommandGroup) -> list[str]:
    """The extra command modules the leader loaded (a follower loads the same)."""
    return json.loads(group.client.key_value_try_get(f"{KEY_ROOT}/modules"))


def decode_frame(raw: bytes) -> tuple[dict[str, Any], Arrays | ArrayError]:
    """Splits one :mod:`app.core.channel` frame held in memory into header and arrays.

    Returns:
      The header and its arrays, or the :class:`~app.core.channel.ArrayError` they raised.

    Raises:
      app.core.channel.ChannelError: the frame is corrupt or truncated.
    """
    if len(raw) < 4:
        raise channel.ChannelError(f"frame of {len(raw)} bytes has no length prefix")
    length = channel.header_length(raw[:4])
    if len(raw) < 4 + length:
        raise channel.ChannelError(f"frame of {len(raw)} bytes holds no {length}-byte header")
    header, total = channel.decode_header(raw[4 : 4 + length])
    body = raw[4 + length :]
    if len(body) != total:
        raise channel.ChannelError(f"frame has {len(body)} array bytes, header says {total}")
    try:
        return header, channel.decode_arrays(header["arrays"], body)
    except ArrayError as exc:
        return header, exc


def follow(
    sock: socket.socket, group: CommandGroup, execute: Execute, local_commands: Iterable[str]
) -> int:
    """A follower runtime's loop: run the leader's commands in order until the parent
    closes the channel.

    Requests from the parent (its supervisor's handshake) are answered here too, but only
    for ``local_commands``: anything else would desynchronise the group (409
    ``not_leader``).

    Returns:
      The exit status: 0 when the parent closed the channel, 1 when the coordination
      service (the leader's runtime) went away.
    """
    from jax.errors import JaxRuntimeError

    local = frozenset(local_commands)
    while True:
        if select.select([sock], [], [], 0)[0]:
            try:
                header, arrays = channel.recv_message(sock)
            except EOFError:
                return 0
            if header.get("command") in local:
                reply, out = execute(header, arrays)
            else:
                reply, out = _not_here(header), {}
            channel.send_message(sock, channel.encode_message(reply, out))
        try:
            raw = group.next_command(POLL_MS)
        except JaxRuntimeError as exc:  # JAX usually aborts the process first
            log.error("lost the group's coordination service: %s", exc)
            return 1
        if raw is None:
            continue
        try:
            header, arrays = decode_frame(raw)
        except channel.ChannelError as exc:
            log.error("corrupt command %d from the leader: %s", group.seq, exc)
            group.ack("error:corrupt_command")
            continue
        reply, _ = execute(header, arrays)
        group.ack(outcome_of(reply))


def _not_here(header: dict[str, Any]) -> dict[str, Any]:
    error = NotLeader(
        f"command {header.get('command')!r} runs on every process and is sent by process "
        "0's runtime only"
    )
    return {"id": header.get("id"), "ok": False, "error": error.to_reply()}


def exit_now(code: int) -> None:
    """Ends a runtime process of a group without Python's shutdown, in which the
    distributed client would wait at a shutdown barrier for the other processes."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
