"""The compile checks waiting for the worker: in arrival order, at most
``DATARAX_COMPILE_QUEUE`` of them.

A full queue is 429 ``compile_queue_full`` with a ``Retry-After`` from the mean compile
time seen so far (:meth:`CheckQueue.retry_after`). Memory: one check's JSON (a
65,536-device plan's id list, ~0.5 MB) per waiting check.
"""

from __future__ import annotations

import asyncio
import collections
import math
from dataclasses import dataclass, field
from typing import Any

from app.core.errors import CompileQueueFull
from app.services.layout_cells import plural
from datarax.answers.compile_checks import CompileCheck

_TIMED_CHECKS = 20
"""How many of the last compile times the Retry-After is the mean of."""
_FIRST_GUESS_S = 10.0
"""The compile time assumed before any was seen."""


@dataclass(eq=False)
class Job:
    """One check not yet settled: its answer as it stands (replaced at each change), what
    the worker compiles, and its cache key."""

    check: CompileCheck
    work: dict[str, Any]
    key: str
    cancelled: bool = False
    answered: bool = False
    """The worker's result or error is in: a cancel from then on changes nothing."""
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def phase(self) -> str | None:
        """``starting``, ``lowering`` or ``compiling`` while it runs, else ``None``."""
        return self.check.phase


class CheckQueue:
    """The waiting checks (bounded) and every check not yet settled, by id.

    Args:
      limit: how many checks may wait (``DATARAX_COMPILE_QUEUE``); the running one is not
        counted.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self._waiting: collections.deque[Job] = collections.deque()
        self._jobs: dict[str, Job] = {}
        self._wake = asyncio.Event()
        self._compile_seconds: collections.deque[float] = collections.deque(maxlen=_TIMED_CHECKS)

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, job: Job) -> bool:
        """``job`` is waiting (not running, not settled)."""
        return job in self._waiting

    def job(self, cid: str) -> Job | None:
        """The unsettled check ``cid`` (waiting or running), if any."""
        return self._jobs.get(cid)

    def put(self, job: Job) -> None:
        """Queues ``job`` last; the runner learns of it at :meth:`wake`.

        Raises:
          CompileQueueFull: ``limit`` checks are waiting already.
        """
        if len(self._waiting) >= self.limit:
            raise CompileQueueFull(
                f"{plural(len(self._waiting), 'compile check')} "
                f"{'is' if len(self._waiting) == 1 else 'are'} waiting (DATARAX_COMPILE_QUEUE="
                f"{self.limit}); retry after the Retry-After seconds",
                headers={"Retry-After": str(self.retry_after())},
            )
        self._jobs[job.check.id] = job
        self._waiting.append(job)

    def wake(self) -> None:
        """Tells the runner waiting in :meth:`next` that a check is there."""
        self._wake.set()

    async def next(self) -> Job:
        """The first waiting check, taken out of the queue (waits for one)."""
        while not self._waiting:
            self._wake.clear()
            await self._wake.wait()
        return self._waiting.popleft()

    def remove(self, job: Job) -> None:
        """Takes a waiting ``job`` out of the queue (a cancel)."""
        self._waiting.remove(job)

    def settled(self, job: Job) -> None:
        """``job`` has its final state: it is no longer looked up here."""
        self._jobs.pop(job.check.id, None)

    def position(self, job: Job) -> int | None:
        """``job``'s place in the queue, from 1; ``None`` when it is not waiting."""
        return self._waiting.index(job) + 1 if job in self._waiting else None

    def timed(self, seconds: float) -> None:
        """A compile took ``seconds`` (for :meth:`retry_after`)."""
        self._compile_seconds.append(seconds)

    def retry_after(self) -> int:
        """Seconds until a check queued now would likely run: the mean of the last
        compile times, once per check ahead of it and its own."""
        seen = self._compile_seconds
        mean = sum(seen) / len(seen) if seen else _FIRST_GUESS_S
        return max(1, math.ceil(mean * (len(self._waiting) + 1)))


__all__ = ["CheckQueue", "Job"]
