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
- ``datarax_job_seconds_since_last_push{job}``: the ``JOB_GAUGE_TOP`` unfinished jobs
  pushed to most recently, plus ``job="<other>"``: the stalest of the rest. A job that
  stops pushing shows a growing value; cardinality stays bounded however many jobs exist.
- ``datarax_job_stragglers{job}``: sources still missing at each job's newest incomplete
  multi-source step, for the ``JOB_GAUGE_TOP`` jobs with most, plus ``"<other>"`` (the
  sum of the rest). Both are read from the store when ``/metrics`` is scraped
  (:meth:`Telemetry.refresh`, in a worker thread). When reads need the token
  (``--auth-reads``), both are one series ``job="<all>"`` (the stalest job; the sum of
  stragglers): the open ``/metrics`` names no job.
- ``datarax_build_info{version, jax, jaxlib, python}``: always 1 (:mod:`app.core.version`).
- ``datarax_sessions_active``: live training sessions.
- ``datarax_session_steps_total``: training steps run.
- ``datarax_compile_seconds``: histogram of step compiles (cache misses only).
- ``datarax_memory_reserved_bytes{pool}``: what the live sessions reserve per memory pool
  (``host:0``, ``device:3``); ``datarax_memory_budget_bytes{kind}``: what sessions may
  reserve per pool of that kind (``host``, ``device``).

Runtime figures without asking the runtime: steps and compile seconds come from the
replies to ``session_step`` that the service receives anyway, each session's reservation
from its ``session_create`` reply, the budget from the runtime's ``devices`` answer.
A ``stats`` command asked at scrape time would queue behind the training steps on the
runtime's one FIFO channel (a scrape could wait minutes, or answer stale figures and say
nothing about it), and would cost a round trip per scrape; counting replies costs a few
additions per step and is exact for this service's runtime. What it cannot see, work
another client does on the devices, no command of this runtime does either.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.core.version import versions

UNMATCHED_ROUTE = "<unmatched>"
JOB_GAUGE_TOP = 20
"""Jobs named in each per-job gauge (the rest are one ``"<other>"`` series)."""

type JobGauges = tuple[dict[str, float], dict[str, float]]


ALL_JOBS = "<all>"
"""The one ``job`` label of the per-job gauges when reads need the token."""


def aggregate_job_gauges(snapshot: JobGauges) -> JobGauges:
    """The per-job gauges without job names: the stalest job's seconds since its last push
    (the snapshot's ``"<other>"`` is the stalest of the unlisted jobs, so the maximum is
    the stalest of all), and the stragglers of every job summed."""
    stale, stragglers = snapshot
    return (
        {ALL_JOBS: max(stale.values())} if stale else {},
        {ALL_JOBS: float(sum(stragglers.values()))} if stragglers else {},
    )


class _JobCollector(Collector):
    """The per-job gauges, from the snapshot the last :meth:`Telemetry.refresh` took.

    ``name_jobs`` False (``--auth-reads``: the job list needs the token, while ``/metrics``
    stays open for scrapers): one series ``job="<all>"`` per gauge, so the open endpoint
    names no job. The label stays, so ``max by (job)`` queries keep working."""

    def __init__(self, name_jobs: bool = True) -> None:
        self.snapshot: JobGauges = ({}, {})
        self.name_jobs = name_jobs

    def collect(self) -> Iterable[Metric]:
        shown = self.snapshot if self.name_jobs else aggregate_job_gauges(self.snapshot)
        stale = GaugeMetricFamily(
            "datarax_job_seconds_since_last_push",
            "Seconds since each unfinished job's last metric push (most recent jobs, "
            "'<other>' = the stalest of the rest)",
            labels=["job"],
        )
        for job, seconds in shown[0].items():
            stale.add_metric([job], seconds)
        yield stale
        stragglers = GaugeMetricFamily(
            "datarax_job_stragglers",
            "Sources missing at each job's newest incomplete multi-source step",
            labels=["job"],
        )
        for job, count in shown[1].items():
            stragglers.add_metric([job], count)
        yield stragglers


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


type SessionFigures = tuple[int, dict[str, int], dict[str, int | None] | None]
"""Live sessions, bytes reserved per pool, the runtime's budgets per pool kind (or None)."""


class _SessionCollector(Collector):
    """Sessions active and memory reserved and budgeted, read when scraped."""

    def __init__(self, read: Callable[[], SessionFigures | None]):
        self._read = read

    def collect(self) -> Iterable[Metric]:
        figures = self._read() or (0, {}, None)
        active, reserved, budgets = figures
        sessions = GaugeMetricFamily("datarax_sessions_active", "Live training sessions")
        sessions.add_metric([], float(active))
        yield sessions
        held = GaugeMetricFamily(
            "datarax_memory_reserved_bytes",
            "Bytes the live sessions reserve, by memory pool",
            labels=["pool"],
        )
        for pool, size in sorted(reserved.items()):
            held.add_metric([pool], float(size))
        yield held
        budget = GaugeMetricFamily(
            "datarax_memory_budget_bytes",
            "Bytes sessions may reserve in each memory pool of a kind (host, device)",
            labels=["kind"],
        )
        for kind, limit in sorted((budgets or {}).items()):
            if limit is not None:
                budget.add_metric([kind], float(limit))
        yield budget


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
        self.steps = Counter("datarax_session_steps", "Training steps run", registry=self.registry)
        self.compile_seconds = Histogram(
            "datarax_compile_seconds",
            "Seconds compiling a session's step (compile-cache misses)",
            registry=self.registry,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
        )
        build = versions()
        Gauge(
            "datarax_build_info",
            "Versions of the service and its runtime (always 1)",
            ["version", "jax", "jaxlib", "python"],
            registry=self.registry,
        ).labels(build["version"], build["jax"], build["jaxlib"], build["python"]).set(1)
        for kind in ("live", "abstract"):
            self.plans_created.labels(kind=kind)
        # Children looked up once: ``labels()`` takes a lock and builds a key per call.
        self._reductions = {
            endpoint: self.reductions.labels(endpoint=endpoint)
            for endpoint in ("reduce", "collect", "job")
        }
        self._per_route: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    def count_steps(self, steps: int, compile_s: float | None) -> None:
        """``steps`` more training steps; ``compile_s`` when their call compiled the step."""
        self.steps.inc(steps)
        if compile_s is not None:
            self.compile_seconds.observe(compile_s)

    def watch_sessions(self, read: Callable[[], SessionFigures | None]) -> None:
        """Exports sessions active and memory reserved and budgeted, from ``read()`` at
        every scrape (``None`` before the service has started)."""
        self.registry.register(_SessionCollector(read))

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

    def watch_jobs(
        self, read: Callable[[int], Awaitable[JobGauges]], *, name_jobs: bool = True
    ) -> None:
        """Exports the per-job gauges; ``read(top)`` is awaited by :meth:`refresh`.
        ``name_jobs=False`` (reads need the token): aggregated under ``job="<all>"``."""
        self._jobs = _JobCollector(name_jobs)
        self._read_jobs = read
        self.registry.register(self._jobs)

    async def refresh(self) -> None:
        """Reads what the gauges show from the store (call before each exposition)."""
        read = getattr(self, "_read_jobs", None)
        if read is not None:
            self._jobs.snapshot = await read(JOB_GAUGE_TOP)

    def watch_runtime(self, restarts: Callable[[], int], ready: Callable[[], bool]) -> None:
        """Exports the runtime's restart count and readiness, read at every scrape."""
        self.registry.register(_RuntimeCollector(restarts, ready))
