"""Prometheus metrics of the service itself (``GET /metrics``).

Each app gets its own ``CollectorRegistry`` (several apps in one test process must not
collide in the global registry). Series:

- ``datarax_http_requests_total{method, route, status}``: requests by route *template*
  (``/v1/meshes/{mesh_id}``, never the raw path, so ids do not explode cardinality);
  unmatched paths count as ``route="<unmatched>"``.
- ``datarax_http_request_duration_seconds{method, route}``: latency histogram.
- ``datarax_mesh_plans_created_total{kind}``: stored plans, ``kind`` live or abstract.
- ``datarax_metric_reductions_total{endpoint}``: reduce/collect/job requests answered.
- ``datarax_job_points_stored_total``: job metric points written.
- ``datarax_runtime_restarts_total``, ``datarax_runtime_ready``: read from the runtime
  at scrape time by a custom collector.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNMATCHED_ROUTE = "<unmatched>"


class _RuntimeCollector(Collector):
    """Reads the runtime's restart count and readiness when scraped."""

    def __init__(self, restarts: Callable[[], int], ready: Callable[[], bool]):
        self._restarts = restarts
        self._ready = ready

    def collect(self) -> Iterable[Metric]:
        restarts = CounterMetricFamily(
            "datarax_runtime_restarts", "Automatic restarts of the device runtime process"
        )
        restarts.add_metric([], float(self._restarts()))
        yield restarts
        ready = GaugeMetricFamily("datarax_runtime_ready", "1 when the device runtime is ready")
        ready.add_metric([], 1.0 if self._ready() else 0.0)
        yield ready


class Telemetry:
    """The service's metrics, on a private registry."""

    def __init__(self) -> None:
        # ``*_created`` timestamp series double the exposition for no use here. The switch
        # is process-wide; the service owns its process.
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=True)
        # The HTTP process's CPU, memory and file descriptors, and the Python version,
        # from prometheus-client's own collectors.
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.requests = Counter(
            "datarax_http_requests",
            "HTTP requests by method, route template and status",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "datarax_http_request_duration_seconds",
            "HTTP request latency by method and route template",
            ["method", "route"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.plans_created = Counter(
            "datarax_mesh_plans_created",
            "Mesh plans stored, by kind (live or abstract)",
            ["kind"],
            registry=self.registry,
        )
        self.reductions = Counter(
            "datarax_metric_reductions",
            "Metric reduce/collect requests answered",
            ["endpoint"],
            registry=self.registry,
        )
        self.job_points = Counter(
            "datarax_job_points_stored", "Job metric points written", registry=self.registry
        )
        for kind in ("live", "abstract"):
            self.plans_created.labels(kind=kind)
        # Children looked up once: ``labels()`` takes a lock and builds a key per call.
        self._reductions = {
            endpoint: self.reductions.labels(endpoint=endpoint)
            for endpoint in ("reduce", "collect", "job")
        }
        self._per_route: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    def count_reduction(self, endpoint: str) -> None:
        """One more answered ``reduce``, ``collect`` or ``job`` request."""
        self._reductions[endpoint].inc()

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        """Counts one answered request and its latency (children cached per key; the
        keys are bounded by methods x route templates x statuses)."""
        key = (method, route, status)
        children = self._per_route.get(key)
        if children is None:
            children = (
                self.requests.labels(method, route, str(status)),
                self.latency.labels(method, route),
            )
            self._per_route[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def watch_runtime(self, restarts: Callable[[], int], ready: Callable[[], bool]) -> None:
        """Exports the runtime's restart count and readiness, read at every scrape."""
        self.registry.register(_RuntimeCollector(restarts, ready))


class RequestMetricsMiddleware:
    """Pure ASGI middleware counting requests and latency per route template.

    The router stores the matched route in ``scope["route"]`` (the same dict this
    middleware passed on), so the template is read after the app has run.
    """

    def __init__(self, app: ASGIApp, telemetry: Telemetry):
        self.app = app
        self.telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or UNMATCHED_ROUTE
            self.telemetry.observe_request(
                scope.get("method", ""), template, status, time.perf_counter() - start
            )
