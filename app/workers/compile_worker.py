"""The compile worker (``python -m app.compiler``) as the compile-check service runs it.

:class:`CompileWorker` starts the worker on demand, keeps it warm for the checks of its
platform, and ends it (:mod:`app.workers.supervisor` does the spawning and killing):

- at most one worker at a time. Its platform is ``cpu`` (CPU devices and TPU topologies)
  or the GPU's; a check for the other platform stops the idle worker and starts one for its
  own (start-up: seconds), so alternating CPU and GPU checks pay a start each, and the host
  never holds two compile workers (the one-shot ``--describe`` aside);
- a GPU worker starts with ``JAX_PLATFORMS=cuda`` (``rocm`` where ``DATARAX_PLATFORMS``
  names it), no preallocation and the platform allocator
  (:func:`app.compiler.__main__.environment`), so it takes no memory pool beside the
  runtime's and holds nothing but its CUDA context after a compile (the step's arrays are
  abstract and never allocated). It inherits the service's environment, so it sees the
  runtime's ``CUDA_VISIBLE_DEVICES`` and ids;
- the memory cap ``DATARAX_COMPILE_MEMORY_MB`` is ``RLIMIT_AS`` on a ``cpu`` worker; a GPU
  worker cannot have one (CUDA maps address ranges as large as the GPUs' memory at start
  and fails under it), so its process group's resident memory is sampled every
  ``_RSS_POLL_S`` while it compiles (:meth:`CompileWorker.watch_rss`) and it is killed past
  the cap;
- a worker that dies is explained by :meth:`CompileWorker.crash_reason`: its signal or
  exit status, the phase of the check it ran, and the last error lines of its log; the
  memory cap is named only when it was hit. The next check starts a fresh worker.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from app.core.settings import Settings
from app.workers.supervisor import PROJECT_ROOT, Child, group_rss_bytes

log = logging.getLogger("datarax.compile")

_WORKER_LOG_LINES = 20
_RSS_POLL_S = 0.25
"""How often a GPU worker's resident memory is sampled against DATARAX_COMPILE_MEMORY_MB."""
_PROJECT_ROOT = str(PROJECT_ROOT)  # where `-m app.compiler` resolves
_READ_LIMIT = 64 * 2**20
"""The longest line the worker may answer (a result of a 65,536-device plan fits)."""
_IDLE_EXIT_S = 10.0
"""How long an idle worker whose input was closed, or a killed one, is waited for."""


class RunningCheck(Protocol):
    """What the worker needs to know of the check it runs (the service's job)."""

    @property
    def cancelled(self) -> bool: ...

    @property
    def phase(self) -> str | None: ...


class CompileWorker:
    """The service's one compile worker process and what is known of it.

    Args:
      settings: the service settings (the cap, the CPU devices, the start timeout).
      running: the check being run, if any (its phase names a crash; a cancel while the
        worker is spawned kills it at once).
      argv, describe_argv: command lines to use instead of ``python -m app.compiler``'s
        (tests stand one platform's worker in for another's).
    """

    def __init__(
        self,
        settings: Settings,
        running: Callable[[], RunningCheck | None],
        *,
        argv: list[str] | None = None,
        describe_argv: list[str] | None = None,
    ):
        self.settings = settings
        self.argv_override = argv
        self.describe_argv_override = describe_argv
        self._running = running
        self._child: Child | None = None
        self._platform: str | None = None
        self._rss_killed: int | None = None
        self._out_of_memory: str | None = None
        """The worker's first log line that shows a failed allocation, if any."""
        self._gpus: dict[str, Any] | None = None
        self._describe_lock = asyncio.Lock()
        self._log_tail: collections.deque[str] = collections.deque(maxlen=_WORKER_LOG_LINES)
        self._log_task: asyncio.Task[None] | None = None
        self.starts = 0
        """Workers started so far."""

    # ------------------------------------------------------------------------- state

    @property
    def pid(self) -> int | None:
        """The running worker's pid, ``None`` while there is none."""
        child = self._child
        return None if child is None or not child.alive else child.pid

    def alive(self, platform: str) -> bool:
        """A warm worker of ``platform`` is there (no start-up for the next check)."""
        child = self._child
        return child is not None and child.alive and self._platform == platform

    # ------------------------------------------------------------------------ command

    def argv(self, platform: str = "cpu", *, describe: bool = False) -> list[str]:
        """The worker's command line for ``platform`` (``cpu``, ``cuda``, ``rocm``)."""
        if describe and self.describe_argv_override is not None:
            return self.describe_argv_override
        if not describe and self.argv_override is not None:
            return self.argv_override
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
    def env() -> dict[str, str]:
        """The service's environment (so ``CUDA_VISIBLE_DEVICES`` and the XLA memory
        settings are the runtime's); the worker sets its platform itself before JAX
        starts (:func:`app.compiler.__main__.environment`)."""
        env = dict(os.environ)
        env.pop("JAX_PLATFORMS", None)
        return env

    # ----------------------------------------------------------------------- describe

    async def describe_gpus(self, platform: str) -> dict[str, Any]:
        """The compile worker's GPUs (``python -m app.compiler --describe``), asked once
        and kept for the service's life (the host's GPUs do not change under a running
        runtime); a failure (``{"error"}``) is not kept, the next GPU check asks again."""
        async with self._describe_lock:
            if self._gpus is not None:
                return self._gpus
            described = await self._describe(platform)
            if not described.get("error"):
                self._gpus = described
            return described

    async def _describe(self, platform: str) -> dict[str, Any]:
        child = await Child.spawn(
            self.argv(platform, describe=True),
            env=self.env(),
            cwd=_PROJECT_ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(
                child.proc.communicate(), timeout=self.settings.runtime_start_timeout_s
            )
        except TimeoutError:
            child.kill()
            await child.wait()
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
        return {"error": f"the compile worker exited with status {child.returncode}: {tail}"}

    # ---------------------------------------------------------------------- lifecycle

    async def ensure(self, platform: str = "cpu") -> asyncio.subprocess.Process:
        """The warm worker of ``platform``, started (and its ``ready`` line read) if there
        is none; an idle worker of the other platform is stopped first.

        Raises:
          RuntimeError: the worker did not start (the reason: :meth:`crash_reason`).
          TimeoutError: it did not say ready within DATARAX_RUNTIME_START_TIMEOUT_S.
        """
        if self._child is not None and self._child.alive:
            if self._platform == platform:
                return self._child.proc
            await self.stop_idle()  # a check for the other platform: one at a time
        self._log_tail.clear()
        self._rss_killed = None
        self._out_of_memory = None
        self._platform = platform
        child = await Child.spawn(
            self.argv(platform),
            env=self.env(),
            cwd=_PROJECT_ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=_READ_LIMIT,
        )
        self._child = child
        self.starts += 1
        self._log_task = asyncio.create_task(self._pump_log(child.proc))
        running = self._running()
        if running is not None and running.cancelled:
            child.kill()  # cancelled while it was spawned: it reads EOF below
        assert child.proc.stdout is not None  # spawned with a pipe
        line = await asyncio.wait_for(
            child.proc.stdout.readline(), timeout=self.settings.runtime_start_timeout_s
        )
        if not line or not json.loads(line).get("ready"):
            status = await self.reap()
            raise RuntimeError("the compile worker did not start: " + self.crash_reason(status))
        return child.proc

    async def _pump_log(self, proc: asyncio.subprocess.Process) -> None:
        """The worker's stderr (libtpu and XLA warnings, tracebacks) into the log."""
        assert proc.stderr is not None  # spawned with a pipe
        async for raw in proc.stderr:
            text = raw.decode(errors="replace").rstrip()
            if text:
                self._log_tail.append(text)
                if self._out_of_memory is None and _shows_out_of_memory((text,)):
                    self._out_of_memory = text[-300:]  # kept: a stack trace may follow
                log.debug("compile worker: %s", text)

    async def reap(self) -> int | None:
        """Waits (bounded) for the worker's exit and its last log lines; forgets it.
        Returns its exit status (``None``: there was none, or it did not end in time)."""
        child = self._child
        if child is None:
            return None
        await child.wait(_IDLE_EXIT_S)
        if self._log_task is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._log_task, timeout=2)
        self._child = None
        return child.returncode

    async def stop_idle(self) -> None:
        """Ends the idle worker: its input closed (it exits), SIGKILL after 10 s."""
        child = self._child
        if child is None:
            return
        await child.stop([(None, _IDLE_EXIT_S), (signal.SIGKILL, 0)])
        await self.reap()

    async def kill(self, *, reap: bool) -> None:
        """Kills the worker's process group (XLA cannot be interrupted mid-compile);
        ``reap``: waits for it too (else the check's reader sees EOF and reaps it)."""
        child = self._child
        if child is None or not child.alive:
            return
        child.kill()
        if reap:
            await self.reap()

    # ------------------------------------------------------------------------- health

    async def watch_rss(self) -> None:
        """Kills the (GPU) worker when its process group's resident memory passes the cap;
        runs until that worker ends or the task is cancelled."""
        child = self._child
        cap = self.settings.compile_memory_mb * 2**20
        while child is not None and child.alive:
            rss = await asyncio.to_thread(group_rss_bytes, child.pid)
            if rss > cap:
                self._rss_killed = rss
                log.warning("compile worker at %d MiB resident, past the cap: killed", rss >> 20)
                child.kill()
                return
            await asyncio.sleep(_RSS_POLL_S)

    def crash_reason(self, status: int | None) -> str:
        """Why the worker died, from what is known, never a guess: the signal or exit
        status; the memory cap only when it was hit (the RSS watchdog killed a GPU
        worker, or the worker's log shows an allocation that failed); the last error
        lines of its log."""
        running = self._running()
        known = running is not None and bool(running.phase)
        phase = f" while {running.phase}" if known and running is not None else ""
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


def _shows_out_of_memory(lines: Iterable[str]) -> bool:
    return any(sign in line for line in lines for sign in _OUT_OF_MEMORY_SIGNS)


__all__ = ["CompileWorker", "RunningCheck"]
