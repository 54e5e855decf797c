"""The HTTP process's handle on the runtime process that owns the devices.

:class:`RuntimeClient` spawns ``python -m app.runtime`` (see :mod:`app.runtime`), talks to
it over a ``socketpair`` with the framing of :mod:`app.core.channel`, and supervises it
(with :mod:`app.workers.supervisor`, as the compile worker is): when the runtime exits for
any reason (an XLA abort, ``kill -9``, a timeout kill) it is marked not ready, the call in
flight fails with :class:`~app.core.errors.WorkerLost`, and a fresh runtime is started
after a backoff (0.5 s doubling to 10 s; back to 0.5 s once a runtime has lived 30 s).
Everything here is asyncio; nothing blocks the event loop, and nothing imports JAX.

Errors: every call raises :class:`~app.core.errors.ServiceError` subclasses only:
``WorkerLost`` (503), ``StepTimeout`` (504), ``ArrayNotAccepted`` (422, before anything is
sent), or the runtime's own error reply through :func:`app.core.errors.from_reply`.

Ordering: one ``asyncio.Lock`` (FIFO) guards the channel, so device commands run one at a
time in the order they were called, whichever session they belong to.

Cancellation: a caller that is cancelled while its command runs (a client hung up) gets
``CancelledError`` at once, but the exchange finishes in the background so the channel
stays in sync and the runtime, with its state, survives. A caller cancelled while still
queued never sends its command.

Timeouts count from the moment a call reaches the head of the queue, so waiting behind
another session's work never kills the runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import logging
import os
import signal
import socket
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import SecretStr

from app.core import channel
from app.core.channel import ArrayError, ChannelError
from app.core.errors import ArrayNotAccepted, RuntimeFailed, ServiceError, StepTimeout, WorkerLost
from app.core.errors import from_reply as error_from_reply
from app.core.logs import REQUEST_ID
from app.core.settings import Settings
from app.runtime.environment import runtime_environment, runtime_platforms
from app.workers.supervisor import PROJECT_ROOT, Backoff, Child, describe_exit

log = logging.getLogger("datarax.runtime")


@dataclass(eq=False)
class _Worker:
    child: Child
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    started_at: float
    lost: bool = False

    @property
    def proc(self) -> asyncio.subprocess.Process:
        return self.child.proc

    def signal_group(self, signum: int) -> None:
        self.child.signal_group(signum)


@dataclass
class _Call:
    started: bool = False


def _log_supervisor_end(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("runtime supervision stopped", exc_info=task.exception())


def _retrieve(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()  # mark retrieved: an abandoned call's error has no one to go to


class RuntimeClient:
    """Spawns, talks to and supervises the runtime process.

    Args:
      settings: service settings; the runtime gets them (less secrets) and its
        environment from them (``cpu_devices``, ``platforms``).
      command_modules: extra modules the runtime imports at start to register more
        commands with :func:`app.runtime.server.command` (tests add theirs); the built-in
        ones (:data:`app.runtime.server.BUILTIN_MODULES`: devices and sessions) are
        always loaded.

    Example:
      >>> client = RuntimeClient(settings)
      >>> await client.start()
      >>> await client.wait_ready(60)
      >>> result, arrays = await client.call("mesh_grid", {"axes": {"data": 2, "model": 4}})
    """

    BACKOFF_INITIAL_S = 0.5
    BACKOFF_MAX_S = 10.0
    HEALTHY_AFTER_S = 30.0
    STOP_GRACE_S = 5.0
    EOF_GRACE_S = 2.0
    """How long :meth:`stop` waits for the runtime to exit on EOF before SIGTERM."""

    def __init__(self, settings: Settings, *, command_modules: Iterable[str] = ()):
        self._settings = settings
        self._command_modules = tuple(command_modules)
        self._lock = asyncio.Lock()
        self._ready = asyncio.Event()
        self._spawned = asyncio.Event()
        self._worker: _Worker | None = None
        self._device_info: dict[str, Any] | None = None
        self._restarts = 0
        self._supervisor: asyncio.Task | None = None
        self._stopping = False
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task] = set()

    # ------------------------------------------------------------------------- state

    @property
    def ready(self) -> bool:
        """The runtime is up and has answered ``devices``."""
        return self._ready.is_set()

    @property
    def restarts(self) -> int:
        """Automatic restarts so far (not counting the first start)."""
        return self._restarts

    @property
    def pid(self) -> int | None:
        """The current runtime's pid, ``None`` while none is running."""
        worker = self._worker
        if worker is None or worker.lost or worker.proc.returncode is not None:
            return None
        return worker.proc.pid

    def device_info(self) -> dict[str, Any] | None:
        """The current runtime's ``devices`` answer (a copy); ``None`` while not ready."""
        return copy.deepcopy(self._device_info) if self.ready else None

    def memory_budget(self) -> dict[str, int | None] | None:
        """The ``memory_budget`` of the ``devices`` answer
        (:func:`app.runtime.devices.memory_budgets`),
        for commands that must decide alike on every process; ``None`` while not ready."""
        if not self.ready or self._device_info is None:
            return None
        return dict(self._device_info.get("memory_budget") or {}) or None

    async def wait_ready(self, timeout: float) -> bool:  # noqa: ASYNC109 - the agreed API
        """Waits up to ``timeout`` seconds for readiness; returns whether it is ready."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), timeout)
        return self.ready

    # ---------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Spawns the runtime and returns; readiness follows in the background."""
        if self._supervisor is not None:
            return
        self._stopping = False
        self._spawned.clear()
        self._supervisor = asyncio.create_task(self._supervise(), name="datarax-runtime")
        self._supervisor.add_done_callback(_log_supervisor_end)
        await self._spawned.wait()

    async def stop(self) -> None:
        """Stops supervision and the runtime: EOF and SIGTERM, SIGKILL after a grace period."""
        self._stopping = True
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor
        self._ready.clear()
        self._device_info = None
        worker, self._worker = self._worker, None
        if worker is not None:
            # EOF first: an idle runtime reads it and exits 0 through Python's own shutdown.
            # SIGTERM only if that takes longer (a command still running): a runtime that
            # loaded libtpu would print libtpu's failure-signal stack trace for a SIGTERM
            # it got while JAX was starting (see app.runtime.__main__._quiet_signals).
            self._lose(worker)
            await worker.child.stop(
                [
                    (None, self.EOF_GRACE_S),  # stdin is /dev/null: EOF is the closed channel
                    (signal.SIGTERM, self.STOP_GRACE_S),
                    (signal.SIGKILL, None),
                ]
            )
        for task in list(self._tasks):
            task.cancel()

    async def _spawn(self) -> _Worker:
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            fd = child_sock.fileno()
            env = runtime_environment(self._settings, os.environ)
            if self._restarts == 0:
                platforms, why = runtime_platforms(self._settings, os.environ)
                log.info("runtime platforms: JAX_PLATFORMS=%s (%s)", platforms, why)
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p
            )
            secrets = {k for k, v in self._settings if isinstance(v, SecretStr)}
            args = [
                "-m",
                "app.runtime",
                f"--fd={fd}",
                f"--parent-pid={os.getpid()}",
                f"--settings-json={self._settings.model_dump_json(exclude=secrets)}",
                *(f"--command-module={m}" for m in self._command_modules),
            ]
            child = await Child.spawn([sys.executable, *args], env=env, pass_fds=[fd])
        except BaseException:
            parent_sock.close()
            raise
        finally:
            child_sock.close()
        reader, writer = await asyncio.open_unix_connection(sock=parent_sock)
        worker = _Worker(child, reader, writer, asyncio.get_running_loop().time())
        self._worker = worker
        log.info("runtime process %d started", child.pid)
        return worker

    async def _supervise(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = Backoff(self.BACKOFF_INITIAL_S, self.BACKOFF_MAX_S, self.HEALTHY_AFTER_S)
        first = True
        while not self._stopping:
            if not first:
                await backoff.sleep()
                self._restarts += 1
            first = False
            try:
                worker = await self._spawn()
            except OSError:
                log.exception("could not start the runtime process")
                continue
            finally:
                self._spawned.set()
            await self._handshake(worker)
            returncode = await worker.proc.wait()
            self._lose(worker)
            worker.signal_group(signal.SIGKILL)  # anything it left in its process group
            backoff.lived(loop.time() - worker.started_at)
            if not self._stopping:
                log.warning(
                    "runtime process %d exited (%s); restarting in %.1f s",
                    worker.proc.pid,
                    describe_exit(returncode),
                    backoff.delay_s,
                )

    async def _handshake(self, worker: _Worker) -> None:
        request_id, parts = self._frame("devices", None, None)
        try:
            info, _ = await self._exchange(
                worker,
                request_id,
                "devices",
                parts,
                self._settings.runtime_start_timeout_s,
                _Call(),
            )
        except ServiceError as exc:
            log.error("runtime process %d did not come up: %s", worker.proc.pid, exc)
            worker.signal_group(signal.SIGKILL)
            return
        if worker is self._worker and not worker.lost:
            self._device_info = info
            self._ready.set()
            log.info(
                "runtime process %d ready: %d devices",
                worker.proc.pid,
                len(info.get("devices", [])),
            )

    def _lose(self, worker: _Worker) -> None:
        """Marks ``worker`` gone and closes its channel, which wakes a reader waiting on it."""
        worker.lost = True
        if worker is self._worker:
            self._ready.clear()
            self._device_info = None
        worker.writer.close()

    # ---------------------------------------------------------------------------- calls

    def _frame(
        self, command: str, payload: dict | None, arrays: Mapping[str, Any] | None
    ) -> tuple[int, list]:
        request_id = next(self._ids)
        header = {"id": request_id, "command": command, "payload": payload or {}}
        http_request_id = REQUEST_ID.get()
        if http_request_id is not None:  # the runtime logs its lines under it
            header["request_id"] = http_request_id
        try:
            return request_id, channel.encode_message(header, arrays)
        except ArrayError as exc:
            raise ArrayNotAccepted(str(exc), code=exc.code) from None

    async def call(
        self,
        command: str,
        payload: dict | None = None,
        arrays: dict[str, np.ndarray] | None = None,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - counts from the head of the queue
    ) -> tuple[dict, dict[str, np.ndarray]]:
        """Runs one runtime command, after every command called before it.

        Args:
          command: a name registered in the runtime (:data:`app.runtime.server.COMMANDS`).
          payload: JSON-able arguments.
          arrays: name -> array (numpy, any allowed dtype and shape, 0-d and empty too).
          timeout: seconds the command may run once it is at the head of the queue;
            default ``settings.step_timeout_s``.

        Returns:
          The command's result and its arrays (writable numpy arrays).

        Raises:
          WorkerLost: the runtime is not ready (raised at once, never queued), or it died
            before answering.
          StepTimeout: the command ran past ``timeout``; the runtime is being restarted.
          ArrayNotAccepted: an array that may not be sent (``unsupported_dtype``,
            ``invalid_array``); nothing was sent.
          ServiceError: the command failed; status and code as the runtime replied
            (:func:`app.core.errors.from_reply`).
        """
        worker = self._worker
        if worker is None or worker.lost or not self.ready:
            raise WorkerLost("the device runtime is not running; it is being restarted")
        request_id, parts = self._frame(command, payload, arrays)
        state = _Call()
        timeout = self._settings.step_timeout_s if timeout is None else timeout
        task = asyncio.create_task(
            self._exchange(worker, request_id, command, parts, timeout, state)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_retrieve)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not state.started:
                task.cancel()  # still queued: nothing was sent, so nothing is left to read
            raise

    async def _exchange(
        self,
        worker: _Worker,
        request_id: int,
        command: str,
        parts: list,
        limit_s: float,
        state: _Call,
    ) -> tuple[dict, dict[str, np.ndarray]]:
        async with self._lock:
            state.started = True
            if worker.lost or worker is not self._worker:
                raise WorkerLost("the device runtime died while the call was queued")
            try:
                async with asyncio.timeout(limit_s):
                    worker.writer.writelines(parts)
                    await worker.writer.drain()
                    header, arrays = await channel.read_message(worker.reader)
            except TimeoutError:
                log.error("runtime command %r ran past %s s: killing the runtime", command, limit_s)
                self._lose(worker)
                worker.signal_group(signal.SIGKILL)
                raise StepTimeout(
                    f"runtime command {command!r} ran past {limit_s} s; the runtime is restarting"
                ) from None
            except (asyncio.IncompleteReadError, ConnectionError, ChannelError) as exc:
                self._lose(worker)
                worker.signal_group(signal.SIGKILL)
                raise WorkerLost(
                    f"the device runtime was lost during {command!r} ({type(exc).__name__})"
                ) from None
            except ArrayError as exc:  # the runtime sent arrays it should not have
                raise RuntimeFailed(f"the runtime's reply to {command!r}: {exc}") from None
            except asyncio.CancelledError:
                # Only on shutdown: a half-done exchange leaves the stream out of sync.
                self._lose(worker)
                worker.signal_group(signal.SIGKILL)
                raise
        if header.get("id") != request_id:
            self._lose(worker)
            worker.signal_group(signal.SIGKILL)
            raise WorkerLost(f"runtime answered request {header.get('id')!r}, not {request_id}")
        if not header.get("ok"):
            error = header.get("error")
            raise error_from_reply(error if isinstance(error, Mapping) else {})
        return header.get("result") or {}, arrays
