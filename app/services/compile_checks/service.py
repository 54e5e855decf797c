"""Compile checks: XLA's own verdict on a plan, from a supervised compile worker.

:class:`CompileChecks` (built by the lifespan) keeps a bounded queue of checks
(:mod:`.queue`) and one compile worker process (:mod:`app.workers.compile_worker`),
started on the first check and kept warm for the checks of its platform. Checks run one
at a time, in arrival order:

- a full queue (``DATARAX_COMPILE_QUEUE`` waiting) is 429 ``compile_queue_full`` with a
  ``Retry-After`` from the mean compile time seen so far;
- a check past ``DATARAX_COMPILE_TIMEOUT_S`` is ``failed``, and a ``DELETE`` of a
  running check ``cancelled`` in every phase (``phase``: ``starting``, the worker being
  spawned or importing JAX; ``lowering``; ``compiling``): both kill the worker's process
  group (XLA cannot be interrupted mid-compile); the next check starts a fresh worker;
- a worker that dies (``kill -9``, its memory cap ``DATARAX_COMPILE_MEMORY_MB``, an XLA
  crash such as the SIGFPE of an MLP of ``[1048576] * 3`` on CPU) fails the check it was
  running with its signal or exit status, the phase, and the last error lines of its log
  (:meth:`app.workers.compile_worker.CompileWorker.crash_reason`); the other checks and
  the service go on;
- ``fits`` is judged here (:func:`.results.judge_fits`), never by default, against the
  target's memory (:mod:`.targets`);
- results are cached in SQLite (:mod:`app.storage.compile_checks`) by
  :func:`.targets.cache_key`; a repeat check is ``done`` when answered.

No JAX in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import replace
from typing import Any

from app.core.errors import CompileCheckNotFound
from app.core.ids import new_ulid, utc_now
from app.core.settings import Settings
from app.schemas.compile_checks import CompileCheckRequest
from app.services.compile_checks.maxtext_runner import MaxTextRunner
from app.services.compile_checks.maxtext_target import maxtext_cache_key, maxtext_target
from app.services.compile_checks.queue import CheckQueue, Job
from app.services.compile_checks.results import estimate_error, judge_fits
from app.services.compile_checks.serving_target import is_serving_plan, serving_target
from app.services.compile_checks.targets import (
    DATARAX_PROGRAM,
    cache_key,
    check_target,
    gpu_platform,
    hbm_source,
    needs_gpu,
    worker_platform,
)
from app.storage.compile_checks import CompileStore
from app.workers.compile_worker import CompileWorker
from datarax.answers.base import decode
from datarax.answers.compile_checks import (
    CompileCheck,
    CompileCheckList,
    CompileError,
    CompileResult,
    CompileStatus,
    CompileTarget,
    EstimateError,
)
from datarax.answers.estimates import MemoryEstimate
from datarax.answers.serving import ServingMemory

log = logging.getLogger("datarax.compile")


class CompileChecks:
    """The queue, the worker and the checks (one per service; built by the lifespan).

    Args:
      settings: the service settings.
      worker_argv, describe_argv: command lines for the compile worker instead of
        ``python -m app.compiler``'s (tests).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        worker_argv: list[str] | None = None,
        describe_argv: list[str] | None = None,
    ):
        self.settings = settings
        self.store = CompileStore(settings.store_location)
        self._queue = CheckQueue(settings.compile_queue)
        self._running: Job | None = None
        self.worker = CompileWorker(
            settings, lambda: self._running, argv=worker_argv, describe_argv=describe_argv
        )
        self._runner: asyncio.Task[None] | None = None
        self.maxtext = MaxTextRunner(settings)
        """Runs the checks of MaxText's program, one process each."""

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

    # ------------------------------------------------------------ the worker, for tests

    @property
    def worker_pid(self) -> int | None:
        return self.worker.pid

    @property
    def worker_starts(self) -> int:
        """Compile workers started so far."""
        return self.worker.starts

    @property
    def _worker_argv(self) -> list[str] | None:
        """The worker command line that replaces ``python -m app.compiler``'s (tests)."""
        return self.worker.argv_override

    @_worker_argv.setter
    def _worker_argv(self, argv: list[str] | None) -> None:
        self.worker.argv_override = argv

    def worker_argv(self, platform: str = "cpu", *, describe: bool = False) -> list[str]:
        """The worker's command line for ``platform`` (``cpu``, ``cuda``, ``rocm``)."""
        return self.worker.argv(platform, describe=describe)

    async def _ensure_worker(self, platform: str = "cpu") -> asyncio.subprocess.Process:
        return await self.worker.ensure(platform)

    async def _kill_worker(self) -> None:
        # Not running a check: nothing will read the worker's EOF, so reap it here.
        self.maxtext.kill()  # a MaxText compile: its runner reads the EOF
        await self.worker.kill(reap=self._running is None)

    async def describe_gpus(self) -> dict[str, Any]:
        """The compile worker's GPUs, asked once (see
        :meth:`app.workers.compile_worker.CompileWorker.describe_gpus`)."""
        return await self.worker.describe_gpus(gpu_platform(self.settings))

    # ---------------------------------------------------------------------- answers

    async def submit(
        self, mesh_id: str, plan: dict[str, Any], request: CompileCheckRequest
    ) -> CompileCheck:
        """Queues a check (or answers it from the cache); returns it.

        Raises:
          CompileTargetUnavailable, CompileQueueFull, and the library's codes.
        """
        serving = None
        if request.program == "maxtext":
            work = await asyncio.to_thread(maxtext_target, plan, request, self.settings)
            estimate = work.pop("estimate")
            key = maxtext_cache_key(work)
        elif is_serving_plan(plan):  # the decode step, judged against the serving memory
            work = await asyncio.to_thread(serving_target, plan, request)
            estimate, serving = None, work.pop("serving_memory")
            key = cache_key(work)
        else:
            gpus = await self.describe_gpus() if needs_gpu(plan) else None
            work = await asyncio.to_thread(check_target, plan, request, self.settings, gpus)
            estimate = work.pop("estimate")
            key = cache_key(work)
        check = CompileCheck(
            id="c_" + new_ulid(),
            mesh_id=mesh_id,
            status="queued",
            created_at=utc_now(),
            cached=False,
            request=request.model_dump(exclude_none=True),
            target=decode(CompileTarget, work["target"]),
            estimate=None if estimate is None else MemoryEstimate.from_json(estimate),
            serving_memory=None if serving is None else ServingMemory.from_json(serving),
        )
        cached = await self.store.get_result(key)
        if cached is not None:
            check = _finished(check, CompileResult.from_json(cached), cached=True)
            await self.store.put_check(check.to_json())
            return check
        job = Job(check, work, key)
        self._queue.put(job)
        await self.store.put_check(check.to_json())
        self._queue.wake()  # after the write: the runner's "compiling" comes second
        return self._view(job)

    async def get(self, cid: str) -> CompileCheck:
        job = self._queue.job(cid)
        if job is not None:
            return self._view(job)
        check = await self.store.get_check(cid)
        if check is None:
            raise CompileCheckNotFound(f"no compile check with id {cid!r}")
        return CompileCheck.from_json(check)

    async def list(self, mesh_id: str, limit: int, offset: int) -> CompileCheckList:
        items, total = await self.store.list_checks(mesh_id, limit, offset)
        shown = []
        for check in items:
            job = self._queue.job(check["id"])
            shown.append(CompileCheck.from_json(check) if job is None else self._view(job))
        return CompileCheckList(items=shown, total=total)

    async def cancel(self, cid: str) -> CompileCheck:
        """Cancels a queued or running check; a finished one is answered as it is.

        Every phase: a queued check leaves the queue; a running one (its worker starting,
        lowering or compiling) has its worker's process group killed, and the runner,
        which looks at ``cancelled`` after each step that could not be interrupted (a
        store write, spawning the worker), settles it ``cancelled`` at once. Only a check
        whose answer is already in (``answered``) ends as that answer.
        """
        job = self._queue.job(cid)
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

    def _view(self, job: Job) -> CompileCheck:
        position = self._queue.position(job)
        if job.check.status == "queued" and position is not None:
            return replace(job.check, position=position)
        return job.check

    async def _settle(
        self,
        job: Job,
        *,
        status: CompileStatus,
        result: CompileResult | None = None,
        error: CompileError | None = None,
    ) -> None:
        try:
            if status == "done":
                assert result is not None  # a done check has XLA's result
                job.check = _finished(job.check, result)
                assert job.check.finished_at is not None
                await self.store.put_result(job.key, job.check.finished_at, result.to_json())
            else:
                job.check = replace(
                    job.check,
                    status=status,
                    finished_at=utc_now(),
                    phase=None,
                    position=None,
                    error=job.check.error if error is None else error,
                )
            if status == "cancelled":  # DELETE's write: it works on a full disk too
                await self.store.put_cancelled(job.check.to_json())
            else:
                await self.store.put_check(job.check.to_json())
            self._queue.settled(job)
        finally:
            # Ended even when the store refused the write (a storage fault): a cancel
            # waiting on it answers and the queue goes on. The check is then answered from
            # memory (it stays in the queue's lookup) until a restart marks it failed.
            job.done.set()

    async def _run(self) -> None:
        while True:
            job = await self._queue.next()
            self._running = job
            try:
                await self._run_one(job)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # a bug here must not stop the queue
                log.exception("compile check %s", job.check.id)
                if not job.done.is_set():
                    await self._settle(
                        job, status="failed", error=_failure(f"internal error: {error}")
                    )
            finally:
                self._running = None

    async def _run_maxtext(self, job: Job) -> None:
        """Runs a check of MaxText's program in a process of its own (:class:`MaxTextRunner`)."""
        job.check = replace(job.check, status="compiling", position=None, phase="starting")
        await self.store.put_check(job.check.to_json())
        if job.cancelled:  # cancelled while the store wrote: nothing to kill yet
            await self._settle(job, status="cancelled")
            return

        def on_phase(phase: str) -> None:
            if phase in ("lowering", "compiling"):
                job.check = replace(job.check, phase=phase)  # type: ignore[arg-type]

        started = time.monotonic()
        try:
            message = await self.maxtext.run(job, on_phase)
        except OSError as error:  # the process could not be started
            await self._settle(job, status="failed", error=_failure(str(error)))
            return
        if "cancelled" in message:
            await self._settle(job, status="cancelled")
        elif "failed" in message:
            await self._settle(job, status="failed", error=_failure(str(message["failed"])))
        elif "result" in message:
            self._queue.timed(time.monotonic() - started)
            work = job.work
            program = dict(message["result"].get("program") or {"name": "maxtext"})
            program["args"] = [
                *work["args"],
                f"compile_topology={work['compile_topology']}",
                f"compile_topology_num_slices={work['compile_topology_num_slices']}",
            ]
            program["env"] = dict(work["env"])
            judged = judge_fits(
                {**message["result"], "program": program}, work["hbm_bytes"], hbm_source(work)
            )
            await self._settle(job, status="done", result=CompileResult.from_json(judged))
        else:
            reason = CompileError.from_json(message["error"]) if "error" in message else None
            await self._settle(job, status="failed", error=reason)

    async def _run_one(self, job: Job) -> None:
        if job.work.get("program") == "maxtext":
            await self._run_maxtext(job)
            return
        platform = worker_platform(job.work["target"], self.settings)
        starting = not self.worker.alive(platform)
        job.check = replace(
            job.check, status="compiling", position=None, phase="starting" if starting else None
        )
        await self.store.put_check(job.check.to_json())
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
                await self._settle(job, status="failed", error=_failure(detail))
            return
        if job.cancelled:  # cancelled in a moment the kill could not reach (spawning)
            await self._kill_worker()
            await self.worker.reap()
            await self._settle(job, status="cancelled")
            return
        if job.check.phase == "starting":
            job.check = replace(job.check, phase=None)
        assert proc.stdin is not None and proc.stdout is not None  # spawned with pipes
        request = {"id": job.check.id, **job.work}
        started = time.monotonic()
        deadline = started + self.settings.compile_timeout_s
        watchdog = None
        if platform != "cpu" and self.settings.compile_memory_mb > 0:
            watchdog = asyncio.create_task(self.worker.watch_rss())
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
                if message.get("id") != job.check.id:
                    continue
                if "phase" in message:
                    job.check = replace(job.check, phase=message["phase"])
                    continue
                job.answered = True
                break
        except TimeoutError:
            await self._kill_worker()
            await self._settle(
                job,
                status="failed",
                error=_failure(
                    f"the compile ran past DATARAX_COMPILE_TIMEOUT_S="
                    f"{self.settings.compile_timeout_s:g} s; the worker was stopped"
                ),
            )
            return
        except (ConnectionResetError, BrokenPipeError, ValueError):
            status = await self.worker.reap()
            if job.cancelled:
                await self._settle(job, status="cancelled")
            else:
                await self._settle(
                    job, status="failed", error=_failure(self.worker.crash_reason(status))
                )
            return
        finally:
            if watchdog is not None:
                watchdog.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watchdog
        self._queue.timed(time.monotonic() - started)
        if "result" in message:
            work = job.work
            figures = {**message["result"], "program": DATARAX_PROGRAM}
            judged = judge_fits(figures, work["hbm_bytes"], hbm_source(work))
            await self._settle(job, status="done", result=CompileResult.from_json(judged))
        else:
            failure = message.get("error")
            reason = None if failure is None else CompileError.from_json(failure)
            await self._settle(job, status="failed", error=reason)


def _failure(detail: str) -> CompileError:
    """A check the service failed: ``compile_failed`` with ``detail``."""
    return CompileError(code="compile_failed", detail=detail)


def _finished(check: CompileCheck, result: CompileResult, *, cached: bool = False) -> CompileCheck:
    """``check`` done with XLA's ``result``, and its estimate against it."""
    estimate = None if check.estimate is None else check.estimate.to_json()
    if check.serving_memory is not None:
        estimate = check.serving_memory.to_json()
    compared = estimate_error(estimate, result.to_json())
    return replace(
        check,
        status="done",
        result=result,
        cached=cached,
        finished_at=utc_now(),
        estimate_error=None if compared is None else EstimateError.from_json(compared),
        position=None,
        phase=None,
    )


__all__ = ["CompileChecks"]
