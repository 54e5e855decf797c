"""Background pushes of one job's metric batches, a bounded number in flight.

A training loop that waits for every push's durable answer (an fsync on the service) idles
for that long each time. :class:`Pusher` (from :meth:`Client.pusher`) and
:class:`AsyncPusher` (from :meth:`AsyncClient.pusher`) send a batch and return at once
while fewer than ``in_flight`` batches wait for their answers; the next push waits for a
free slot, so memory stays bounded (``in_flight`` encoded bodies). The service decodes one
batch while it commits the other, and commits batches that wait together in one
transaction, so two in flight roughly double the throughput of one (BENCHMARKS.md).

What a push promises is unchanged: a batch is durable once *its* answer arrived, and
:meth:`Pusher.flush` returns after every answer so far (the results in push order). The
arrays are encoded when ``push_arrays`` is called, so the caller may reuse them at once.
A refused batch raises its :class:`~datarax.client.ApiError` at the next ``push_*`` call
or at ``flush`` (batches already sent still complete; nothing is sent after the error is
raised until the caller pushes again). Retries (503, 429, lost answers) are the client's,
per batch: a retried batch is a no-op on the service.

Linked to a plan: with ``plan`` (default: the ``DATARAX_PLAN_ID`` environment variable,
which every launch config of the service sets), the pusher links the job to that stored
plan once its first batch is stored (``Client.link_job_to_plan``), so that the job's
answers carry ``fidelity``. A link the service refuses does not fail the pushes: it is
kept as ``link_error`` and warned about once.
"""

from __future__ import annotations

import asyncio
import os
import threading
import warnings
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from datarax.client._core import Call, arrays_batch_call, batch_call, dumps
from datarax.client.answers import BatchResult, JobSummary

MAX_IN_FLIGHT = 16
"""The most batches a pusher keeps unanswered (each holds its encoded body)."""


def _check_in_flight(in_flight: int) -> int:
    if not 1 <= in_flight <= MAX_IN_FLIGHT:
        raise ValueError(f"in_flight must be 1 to {MAX_IN_FLIGHT}; got {in_flight}")
    return in_flight


class _Batches:
    """What both pushers share: the calls they build for their job."""

    def __init__(self, job: str, source: str | None, sources: int | None) -> None:
        self.job, self.source, self.sources = job, source, sources

    def arrays(
        self,
        steps: Any,
        metrics: Mapping[str, Any],
        reduce: Mapping[str, str] | None,
        weights: Any,
        nan_policy: str | None,
    ) -> Call[BatchResult]:
        # The npz body is written here: the caller may change its arrays once push returns.
        return arrays_batch_call(
            self.job, steps, metrics, reduce, weights, nan_policy, self.source, self.sources
        )

    def points(self, points: list[Mapping[str, Any]]) -> Call[BatchResult]:
        call = batch_call(self.job, points, self.source, self.sources)
        # Encoded now, as the arrays are: the caller may change its points once push returns.
        call.content, call.content_type, call.json = dumps(call.json), "application/json", None
        return call


class _Pusher:
    """What both pushers hold: the job's call builder, the slots, the results so far."""

    def __init__(
        self,
        client: Any,
        job: str,
        *,
        in_flight: int = 2,
        source: str | None = None,
        sources: int | None = None,
        plan: str | None = None,
    ) -> None:
        self._client = client
        self._batches = _Batches(job, source, sources)
        self._done = 0  # batches before this index are answered and checked
        self.results: list[BatchResult] = []
        """The :class:`~datarax.client.BatchResult` of each answered batch, in push order."""
        self.plan = (plan if plan is not None else os.environ.get("DATARAX_PLAN_ID")) or None
        """The plan the job is linked to after its first stored batch (``None``: none)."""
        self.linked: JobSummary | None = None
        """The job's summary the link answered (its ``fidelity`` then)."""
        self.link_error: Exception | None = None
        self._link_tried = False
        self._link_lock = threading.Lock()
        self._start(_check_in_flight(in_flight))

    def _link_call(self) -> Call[JobSummary] | None:
        """The link's call, the first time a batch is stored (``None`` after, or with no
        plan)."""
        if self.plan is None:
            return None
        with self._link_lock:
            if self._link_tried:
                return None
            self._link_tried = True
        body = {"plan": self.plan, "step_time_metric": "step_time"}
        return Call("PATCH", f"/v1/jobs/{self._batches.job}", json=body)

    def _link_failed(self, error: Exception) -> None:
        self.link_error = error
        warnings.warn(
            f"job {self._batches.job!r} was not linked to plan {self.plan!r}: {error}",
            RuntimeWarning,
            stacklevel=3,
        )

    def _start(self, in_flight: int) -> None:
        raise NotImplementedError


class Pusher(_Pusher):
    """Pushes one job's batches from worker threads, at most ``in_flight`` unanswered
    (``Client.pusher(job, in_flight=2, source=None, sources=None)``). Use it as a context
    manager: leaving the block flushes (and raises the first error)."""

    def _start(self, in_flight: int) -> None:
        self._slots = threading.BoundedSemaphore(in_flight)
        self._pool = ThreadPoolExecutor(in_flight, thread_name_prefix="datarax-push")
        self._futures: list[Future[BatchResult]] = []

    def push_arrays(
        self,
        steps: Any,
        metrics: Mapping[str, Any],
        reduce: Mapping[str, str] | None = None,
        *,
        weights: Any = None,
        nan_policy: str | None = None,
    ) -> None:
        """As :meth:`Client.push_job_metrics_arrays`, without waiting for the answer."""
        self._submit(self._batches.arrays(steps, metrics, reduce, weights, nan_policy))

    def push_batch(self, points: list[Mapping[str, Any]]) -> None:
        """As :meth:`Client.push_job_metrics_batch`, without waiting for the answer."""
        self._submit(self._batches.points(points))

    def _submit(self, call: Call[BatchResult]) -> None:
        self._collect(wait=False)
        self._slots.acquire()
        try:
            future = self._pool.submit(self._send_then_link, call)
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _: self._slots.release())
        self._futures.append(future)

    def _send_then_link(self, call: Call[BatchResult]) -> BatchResult:
        answer: BatchResult = self._client._send(call, BatchResult)
        link = self._link_call()
        if link is not None:
            try:
                self.linked = self._client._send(link, JobSummary)
            except Exception as error:  # noqa: BLE001 (kept and warned: the pushes go on)
                self._link_failed(error)
        return answer

    def _collect(self, *, wait: bool) -> None:
        """Moves answered batches (in order) to ``results``; raises the first error."""
        while self._done < len(self._futures):
            future = self._futures[self._done]
            if not wait and not future.done():
                return
            self._done += 1
            self.results.append(future.result())  # raises the batch's ApiError

    def flush(self) -> list[BatchResult]:
        """Waits for every batch pushed so far; returns all results in push order.
        Raises the first refused batch's error (the later batches still complete)."""
        try:
            self._collect(wait=True)
        finally:
            self._wait_rest()  # wait for them all, whatever happened first
        return self.results

    def _wait_rest(self) -> None:
        for future in self._futures[self._done :]:
            future.exception()

    def close(self) -> None:
        """Flushes, then stops the worker threads."""
        try:
            self.flush()
        finally:
            self._pool.shutdown(wait=True)

    def __enter__(self) -> Pusher:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        if kind is None:
            self.close()
            return
        # The block raised: let its error through, after the sent batches completed.
        self._wait_rest()
        self._pool.shutdown(wait=True)


class AsyncPusher(_Pusher):
    """:class:`Pusher` for :class:`AsyncClient`: ``await pusher.push_arrays(...)`` returns
    once the batch is sent off (a task), waiting only for a free slot."""

    def _start(self, in_flight: int) -> None:
        self._slots = asyncio.Semaphore(in_flight)
        self._tasks: list[asyncio.Task[BatchResult]] = []

    async def push_arrays(
        self,
        steps: Any,
        metrics: Mapping[str, Any],
        reduce: Mapping[str, str] | None = None,
        *,
        weights: Any = None,
        nan_policy: str | None = None,
    ) -> None:
        await self._submit(self._batches.arrays(steps, metrics, reduce, weights, nan_policy))

    async def push_batch(self, points: list[Mapping[str, Any]]) -> None:
        await self._submit(self._batches.points(points))

    async def _submit(self, call: Call[BatchResult]) -> None:
        self._collect()
        await self._slots.acquire()

        async def send() -> BatchResult:
            try:
                answer: BatchResult = await self._client._send(call, BatchResult)
            finally:
                self._slots.release()
            link = self._link_call()
            if link is not None:
                try:
                    self.linked = await self._client._send(link, JobSummary)
                except Exception as error:  # noqa: BLE001 (kept and warned: pushes go on)
                    self._link_failed(error)
            return answer

        self._tasks.append(asyncio.ensure_future(send()))

    def _collect(self) -> None:
        while self._done < len(self._tasks) and self._tasks[self._done].done():
            task = self._tasks[self._done]
            self._done += 1
            self.results.append(task.result())

    async def flush(self) -> list[BatchResult]:
        pending = self._tasks[self._done :]
        await asyncio.gather(*pending, return_exceptions=True)
        self._collect()
        return self.results

    async def __aenter__(self) -> AsyncPusher:
        return self

    async def __aexit__(self, kind: object, *exc: object) -> None:
        if kind is None:
            await self.flush()
            return
        await asyncio.gather(*self._tasks[self._done :], return_exceptions=True)
