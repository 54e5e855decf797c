"""Runs one MaxText compile (``python -m app.compiler.maxtext``) for a compile check with
``"program": "maxtext"``, bounded like the library's compile worker.

- one process per check, in a process group of its own (:class:`app.workers.supervisor.Child`):
  each check's ``LIBTPU_INIT_ARGS`` is read once, when libtpu starts, so a warm process
  could not serve a check with other XLA flags;
- its environment: the service's, with MaxText's (:func:`.maxtext_target.maxtext_site`)
  first on ``PYTHONPATH`` and the launch's ``LIBTPU_INIT_ARGS``/``XLA_FLAGS`` in place of
  the service's;
- bounded: ``DATARAX_COMPILE_MEMORY_MB`` is its ``RLIMIT_AS``; past
  ``DATARAX_COMPILE_TIMEOUT_S`` its process group is killed and the check failed;
  :meth:`MaxTextRunner.kill` (a ``DELETE``, the service stopping) kills it at once;
- its log (MaxText prints its whole configuration) is drained as it comes; the last error
  lines explain a process that died.

No JAX in this process.
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
import time
from collections.abc import Callable
from typing import Any

from app.core.settings import Settings
from app.services.compile_checks.maxtext_target import LAUNCH_ENV, maxtext_site
from app.services.compile_checks.queue import Job
from app.workers.supervisor import PROJECT_ROOT, Child

log = logging.getLogger("datarax.compile")

_LOG_LINES = 40
_READ_LIMIT = 64 * 2**20
_EXIT_S = 10.0
_OOM_SIGNS = ("MemoryError", "bad_alloc", "Cannot allocate memory", "ailed to allocate")


class MaxTextRunner:
    """The MaxText compile of the check being run, if any (one at a time: the queue's).

    Args:
      settings: the service settings (memory cap, timeout).
    """

    def __init__(self, settings: Settings):
        self.settings = settings
        self._child: Child | None = None
        self._log_tail: collections.deque[str] = collections.deque(maxlen=_LOG_LINES)
        self.starts = 0
        """Compiles started so far."""

    @property
    def pid(self) -> int | None:
        child = self._child
        return None if child is None or not child.alive else child.pid

    def argv(self) -> list[str]:
        memory = str(self.settings.compile_memory_mb)
        return [sys.executable, "-m", "app.compiler.maxtext", "--memory-mb", memory]

    @staticmethod
    def env(work: dict[str, Any]) -> dict[str, str]:
        """The compile's environment (see the module doc)."""
        env = dict(os.environ)
        env.pop("JAX_PLATFORMS", None)
        for name in LAUNCH_ENV:
            env.pop(name, None)
        env.update(work.get("env") or {})
        paths = [str(maxtext_site()), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        return env

    def kill(self) -> None:
        """Kills the running compile's process group (XLA cannot be interrupted)."""
        child = self._child
        if child is not None and child.alive:
            child.kill()

    async def _pump_log(self, child: Child) -> None:
        assert child.proc.stderr is not None  # spawned with a pipe
        async for raw in child.proc.stderr:
            text = raw.decode(errors="replace").rstrip()
            if text and "Config param" not in text:
                self._log_tail.append(text)
                log.debug("maxtext compile: %s", text)

    def _crash_reason(self, status: int | None) -> str:
        if status is None:
            how = "ended"
        elif status < 0:
            how = f"died of {signal.Signals(-status).name}"
        else:
            how = f"exited with status {status}"
        lines = [
            line
            for line in self._log_tail
            if "Error" in line or "error" in line or "memory" in line or "failed" in line
        ]
        reason = f"the MaxText compile process {how} without an answer"
        if any(sign in line for line in lines for sign in _OOM_SIGNS):
            reason += (
                f": it ran out of memory under its cap of {self.settings.compile_memory_mb} "
                "MiB (DATARAX_COMPILE_MEMORY_MB)"
            )
        tail = " | ".join(lines)[-800:]
        return reason + (f"; its last errors: {tail}" if tail else "")

    async def run(self, job: Job, on_phase: Callable[[str], None]) -> dict[str, Any]:
        """Compiles ``job``'s work; answers the process's last message (``{"result"}`` or
        ``{"error": {"code", "detail"}}``), ``{"cancelled": True}`` when the check was
        cancelled meanwhile, or ``{"failed": reason}`` (timeout, a process that died).
        Sets ``job.answered`` as soon as the answer is read."""
        self._log_tail.clear()
        work = job.work
        request = {
            "id": job.check.id,
            **{k: work[k] for k in ("args", "compile_topology", "compile_topology_num_slices")},
            "hbm_bytes": work.get("hbm_bytes"),
        }
        child = await Child.spawn(
            self.argv(),
            env=self.env(work),
            cwd=PROJECT_ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=_READ_LIMIT,
        )
        self._child = child
        self.starts += 1
        pump = asyncio.create_task(self._pump_log(child))
        try:
            return await self._exchange(job, child, request, on_phase)
        finally:
            child.kill()  # it exits after its answer; a kill of a gone group is nothing
            await child.wait(_EXIT_S)
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(pump, timeout=2)
            self._child = None

    async def _exchange(
        self,
        job: Job,
        child: Child,
        request: dict[str, Any],
        on_phase: Callable[[str], None],
    ) -> dict[str, Any]:
        proc = child.proc
        assert proc.stdin is not None and proc.stdout is not None  # spawned with pipes
        if job.cancelled:
            return {"cancelled": True}
        deadline = time.monotonic() + self.settings.compile_timeout_s
        try:
            proc.stdin.write((json.dumps(request) + "\n").encode())
            await proc.stdin.drain()
            proc.stdin.close()
            while True:
                line = await asyncio.wait_for(
                    proc.stdout.readline(), timeout=max(0.0, deadline - time.monotonic())
                )
                if not line:
                    raise ConnectionResetError("the compile process closed its output")
                message = json.loads(line)
                if message.get("id") != job.check.id:
                    continue
                if "phase" in message:
                    on_phase(str(message["phase"]))
                    continue
                job.answered = True
                return dict(message)
        except TimeoutError:
            child.kill()
            return {
                "failed": f"the MaxText compile ran past DATARAX_COMPILE_TIMEOUT_S="
                f"{self.settings.compile_timeout_s:g} s; its process was stopped"
            }
        except (ConnectionResetError, BrokenPipeError, ValueError):
            status = await child.wait(_EXIT_S)
            if job.cancelled:
                return {"cancelled": True}
            return {"failed": self._crash_reason(status)}


__all__ = ["MaxTextRunner"]
