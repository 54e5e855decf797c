"""CPU-heavy request work in a lane of its own: bounded, and abandoned when nobody waits.

Recommendations and large plans (more than :data:`LARGE_PLAN_DEVICES` devices) are
pure-Python/numpy work of up to seconds. They run here, not on the threads that the
store, ``/health/ready`` and job pushes use:

- **Bounded.** At most ``DATARAX_HEAVY_WORKERS`` (default 2) run at once, on an
  :class:`anyio.CapacityLimiter` of their own (anyio's worker threads are created on
  demand; a limiter bounds how many run a given kind of work, so heavy work never takes
  the default limiter's 40 tokens that every other ``to_thread`` call shares). At most
  ``DATARAX_HEAVY_QUEUE`` (default 8) more wait for a slot; beyond that the request is
  503 ``busy`` with ``Retry-After`` at once, before any work.
- **Abandoned.** While a request waits or works, a watcher polls every
  :data:`WATCH_S` whether its client is still connected (ASGI ``http.disconnect``,
  through Starlette's ``Request.is_disconnected``) and whether the service is shutting
  down (SIGTERM). Then it sets the work's cancel flag and cancels the wait; the work
  checks the flag between candidates / rows (``should_stop``) and ends with
  :class:`~datarax.plan.layout.PlanCancelled`, so its slot frees within
  ~0.1-0.25 s of the hang-up (measured, benchmarks/heavy_work.py) instead of after
  the whole search. A gone client's request answers
  499 ``request_abandoned`` (no one reads it; the access log shows it); one cut by
  shutdown answers 503 ``shutting_down``, and the server stops promptly.

- **Yielding.** Heavy work is pure Python and holds the GIL; each ``should_stop`` check
  (~0.3 ms of work apart in a search) also gives the GIL up (``time.sleep(0)``), so the
  event loop and the store's threads wait for it far less than the interpreter's 5 ms
  switch interval. Measured with 16 heavy requests (2 running): ``/health/ready`` median
  136 ms without the yield, ~11-30 ms with it (BENCHMARKS.md, "Heavy requests abandoned").

Design choice: cooperative cancellation, not killed threads or processes. The work is
plain library code (:mod:`datarax.estimate.recommend`,
:mod:`app.services.plans`); a flag checked between units of work costs nothing
measurable and leaves no half-written state.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from app.core.errors import ServiceError
from app.services.layout_cells import plural
from datarax.plan.layout import PlanCancelled

log = logging.getLogger("datarax.app")

T = TypeVar("T")

LARGE_PLAN_DEVICES = 4096
"""Plans over more devices than this take the heavy lane. Measured on the 2-core dev box
(2026-12-02, ``render_plan`` / ``render_hardware_plan`` in process): an abstract plan of
4,096 devices renders in ~10 ms, one of 262,144 in ~1.1 s; a tpu-v5e 16x16 x 1,024
hardware plan (262,144 devices, the cap) in ~3 s, 48 MB."""

WATCH_S = 0.1
"""How often a waiting or working heavy request checks its client and the shutdown flag."""

RETRY_AFTER_S = 2
"""``Retry-After`` of a 503 ``busy``: about one heavy request's time at the limits."""


class HeavyWork:
    """The heavy lane of one app: a limiter, a queue bound, and the cancel flags.

    Args:
      slots: heavy requests at once (``DATARAX_HEAVY_WORKERS``).
      queue: heavy requests waiting at most (``DATARAX_HEAVY_QUEUE``).
      shutting_down: answers true from SIGTERM on (``app.main.Lifecycle``).
    """

    def __init__(self, slots: int, queue: int, shutting_down: Callable[[], bool]):
        self.slots = slots
        self.queue = queue
        self.limiter = anyio.CapacityLimiter(slots)
        self.shutting_down = shutting_down
        self.admitted = 0
        """Requests running or waiting now."""
        self.abandoned = 0
        """Requests stopped because their client left or the service stopped (a count)."""

    async def run(
        self,
        what: str,
        work: Callable[[Callable[[], bool]], T],
        client_gone: Callable[[], Awaitable[bool]] | None = None,
    ) -> T:
        """Runs ``work(should_stop)`` on a heavy slot and answers its result.

        Args:
          what: a few words for the log (``"recommendation"``).
          work: the blocking work; it calls ``should_stop()`` between units of work and
            raises ``PlanCancelled`` when it answers true.
          client_gone: answers true once the client has disconnected (the route's
            ``request.is_disconnected``); ``None``: nobody to watch.

        Raises:
          ServiceError: 503 ``busy`` (slots and queue full; ``Retry-After``), 499
            ``request_abandoned`` (the client left), 503 ``shutting_down`` (SIGTERM);
            and whatever ``work`` raises.
        """
        if self.admitted >= self.slots + self.queue:
            raise ServiceError(
                f"{plural(self.admitted, 'heavy request')} (recommendations, large plans) "
                f"{'is' if self.admitted == 1 else 'are'} running "
                f"or waiting, the most this service takes ({self.slots} at once, "
                f"DATARAX_HEAVY_WORKERS, and {self.queue} waiting, DATARAX_HEAVY_QUEUE); "
                f"retry after {RETRY_AFTER_S} s",
                code="busy",
                headers={"Retry-After": str(RETRY_AFTER_S)},
                extra={"slots": self.slots, "queue": self.queue},
            )
        self.admitted += 1
        stop = threading.Event()
        reason: list[str] = []
        outcome: dict[str, Any] = {}
        started = time.monotonic()

        def should_stop() -> bool:
            # Heavy work is pure Python: it holds the GIL but for the interpreter's forced
            # switches (every 5 ms). Giving it up at each check (~0.3 ms of work apart)
            # lets the event loop and the store's threads run at once.
            time.sleep(0)
            return stop.is_set()

        try:
            async with anyio.create_task_group() as group:

                async def watch() -> None:
                    while True:
                        if self.shutting_down():
                            reason.append("the service is shutting down")
                        elif client_gone is not None and await client_gone():
                            reason.append("the client disconnected")
                        if reason:
                            stop.set()
                            group.cancel_scope.cancel()
                            return
                        await anyio.sleep(WATCH_S)

                group.start_soon(watch)
                try:
                    # Not abandon_on_cancel: the slot is freed when the thread has really
                    # ended, which the flag makes prompt.
                    outcome["value"] = await anyio.to_thread.run_sync(
                        lambda: work(should_stop), limiter=self.limiter
                    )
                except PlanCancelled:
                    pass
                except Exception as error:  # noqa: BLE001 - re-raised below, outside the group
                    outcome["error"] = error
                finally:
                    group.cancel_scope.cancel()
        finally:
            self.admitted -= 1
        if "error" in outcome:
            raise outcome["error"]
        if "value" in outcome and not reason:
            return outcome["value"]
        self.abandoned += 1
        why = reason[0] if reason else "it was cancelled"
        log.info("abandoned %s after %.2f s: %s", what, time.monotonic() - started, why)
        if reason and reason[0].startswith("the service"):
            raise ServiceError(
                f"the {what} was stopped: the service is shutting down; retry on another "
                "instance or after the restart",
                code="shutting_down",
            )
        raise ServiceError(f"the {what} was stopped: {why}", code="request_abandoned")


def heavy_work(app: Any) -> HeavyWork:
    """The app's heavy lane, made on first use from its settings and lifecycle."""
    lane = getattr(app.state, "heavy_work", None)
    if lane is None:
        settings = app.state.settings
        lifecycle = app.state.lifecycle
        lane = HeavyWork(
            settings.heavy_workers,
            settings.heavy_queue,
            lambda: bool(getattr(lifecycle, "shutting_down", False)),
        )
        app.state.heavy_work = lane
    return lane


__all__ = ["LARGE_PLAN_DEVICES", "HeavyWork", "heavy_work"]
