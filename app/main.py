"""The FastAPI app: ``create_app(settings)`` and its lifespan.

The lifespan opens the store and starts the runtime process without waiting for it to be
ready (``/health/ready`` says when it is); shutdown stops both. Nothing here imports JAX
or touches a device: the HTTP process never initialises a JAX backend. The guards and
error handlers are :mod:`app.api.middleware`; the command line is :mod:`app.cli`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import anyio.to_thread
from fastapi import FastAPI
from fastapi.routing import APIRoute

from app.api.http_cache import HttpCacheMiddleware, add_cors
from app.api.http_limits import AnswerLimitMiddleware, HeaderLimitMiddleware
from app.api.middleware import (
    BearerAuthMiddleware,
    BodyLimitMiddleware,
    HeadAsGetMiddleware,
    ShutdownMiddleware,
    install_error_handlers,
)
from app.api.openapi import openapi_builder
from app.api.request_context import RequestIdMiddleware
from app.api.request_metrics import RequestMetricsMiddleware
from app.api.routes import (
    calibrations,
    compile_checks,
    dashboard,
    devices,
    hardware,
    health,
    jobs,
    launch,
    meshes,
    metrics,
    models,
    recommendations,
    sessions,
)
from app.core.settings import Settings
from app.core.telemetry import SessionFigures, Telemetry
from app.core.version import package_version
from app.services.compile_checks import CompileChecks
from app.services.heavy_work import heavy_work
from app.services.host_calibration import HostCalibrations
from app.services.jobs.retention import retention_loop
from app.services.jobs.summaries import job_gauges
from app.services.sessions import SessionService
from app.storage.engines import store_at
from app.workers.runtime_client import RuntimeClient

log = logging.getLogger("datarax.app")

API_DESCRIPTION = """\
Plans JAX device meshes (live on this service's devices, or abstract for any cluster
size), reduces stacked per-device metric arrays, and keeps plans and job metric
history in SQLite. The [dashboard](/) shows plans, jobs, sessions and devices.

* Every error is RFC 9457 problem details (`application/problem+json`) with `type`,
  `title`, `status`, `detail` and a snake_case `code`; validation errors add `errors`
  with each offending field (`loc`, `field`).
* JSON has no NaN: non-finite floats are answered as `null`. Requests may send `NaN`,
  `Infinity` and `-Infinity` literals or `null` in float metric data.
* Malformed JSON is 422 `invalid_json`; a body other than JSON (or `application/x-npz`
  where accepted) is 415 `unsupported_media_type`; bodies above `DATARAX_MAX_BODY_MB`
  are 413 `payload_too_large`.
* When `DATARAX_API_TOKEN` is set, POST and DELETE need `Authorization: Bearer <token>`
  (else 401 `unauthorized`).
* A 2xx answer to a write means it is committed durably.
"""


class Lifecycle:
    """Where the process is in its life; ``app.cli`` sets ``shutting_down`` on SIGTERM."""

    shutting_down = False


def operation_id(route: APIRoute) -> str:
    """OpenAPI operation ids in plain words: the endpoint function's name
    (``create_mesh``, ``push_job_metrics``), so generated clients get readable methods."""
    return route.name


# ------------------------------------------------------------------------------ app


def session_figures(app: FastAPI) -> SessionFigures | None:
    """What ``/metrics`` shows of sessions and memory (``None`` before the lifespan ran)."""
    service = getattr(app.state, "sessions", None)
    if service is None:
        return None
    budget = app.state.runtime.memory_budget() if app.state.runtime is not None else None
    return service.live_count(), service.memory_reserved(), budget


OPENAPI_TAGS = [
    {"name": "meshes", "description": "mesh plans: live and abstract"},
    {"name": "sessions", "description": "sharded training steps on live meshes"},
    {"name": "metrics", "description": "reductions of stacked per-device metrics"},
    {"name": "jobs", "description": "per-job metric history"},
    {"name": "devices", "description": "the runtime's devices"},
    {"name": "hardware", "description": "hardware catalog and mesh recommendations"},
    {"name": "health", "description": "liveness, readiness, Prometheus"},
]

# The route modules, in the order their routes are matched.
ROUTE_MODULES = (
    health,
    metrics,
    jobs,
    devices,
    meshes,
    launch,
    sessions,
    hardware,
    models,
    calibrations,
    recommendations,
    compile_checks,
    dashboard,
)


def create_app(
    settings: Settings | None = None, *, runtime: RuntimeClient | None = None
) -> FastAPI:
    """Builds the service.

    Args:
      settings: service settings (default: from ``DATARAX_*`` environment variables).
      runtime: a device runtime to use instead of spawning ``RuntimeClient(settings)``
        (tests pass a stand-in with its interface).

    Returns:
      The FastAPI app; its lifespan opens the store and starts the runtime.
    """
    settings = settings or Settings()
    telemetry = Telemetry()
    app = FastAPI(
        title="datarax mesh service",
        version=package_version(),  # the package's, as `datarax-serve --version` prints
        description=API_DESCRIPTION,
        lifespan=service_lifespan(settings, telemetry, runtime),
        generate_unique_id_function=operation_id,
        # Swagger UI and ReDoc come from the package (app.api.routes.dashboard), not a CDN.
        docs_url=None,
        redoc_url=None,
        openapi_tags=OPENAPI_TAGS,
    )
    app.state.settings = settings
    app.state.byte_limits = settings.byte_limits()
    app.state.telemetry = telemetry
    app.state.lifecycle = Lifecycle()
    heavy_work(app)  # the heavy lane, made once: app.state.heavy_work
    app.state.runtime = runtime
    watch_service(app, settings, telemetry)
    install_error_handlers(app)
    add_routes(app)
    app.openapi = openapi_builder(app)  # type: ignore[method-assign]
    add_middleware(app, settings, telemetry)
    return app


def service_lifespan(
    settings: Settings, telemetry: Telemetry, runtime: RuntimeClient | None
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: opens the store, starts the runtime and the background loops.

    Args:
      settings: service settings.
      telemetry: the app's telemetry, shared with the session service.
      runtime: the device runtime to start; None spawns ``RuntimeClient(settings)``.

    Returns:
      The lifespan for ``FastAPI(lifespan=...)``; on exit it stops what it started and
      closes the store last, even when a stop fails.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = store_at(settings.store_location)
        await anyio.to_thread.run_sync(store.open)
        rt = runtime if runtime is not None else RuntimeClient(settings)
        app.state.store = store
        app.state.runtime = rt
        app.state.sessions = SessionService(store, rt, settings, telemetry)
        checks = app.state.compile_checks = CompileChecks(settings)
        await checks.start()
        hosts = app.state.host_calibrations = HostCalibrations(
            store, rt, keep=settings.calibrations_keep
        )
        await hosts.recover()
        retention = asyncio.create_task(
            retention_loop(store, settings.job_retention_days, settings.plan_retention_days)
        )
        expiry = asyncio.create_task(app.state.sessions.expire_idle_loop())
        try:
            await rt.start()
            log.info("datarax service up (database %s)", settings.store_name)
            yield
        finally:
            try:
                retention.cancel()
                expiry.cancel()
                await hosts.stop()
                await checks.stop()
                await rt.stop()
            finally:
                store.close()

    return lifespan


def watch_service(app: FastAPI, settings: Settings, telemetry: Telemetry) -> None:
    """Points ``/metrics`` at the runtime, the jobs and the sessions of ``app``.

    The figures are read through ``app.state`` when scraped, so they follow the runtime
    and store that the lifespan sets later.
    """
    telemetry.watch_runtime(
        lambda: int(getattr(app.state.runtime, "restarts", 0) or 0),
        lambda: bool(getattr(app.state.runtime, "ready", False)),
    )
    reads_need_token = bool(
        settings.auth_reads and settings.api_token and settings.api_token.get_secret_value()
    )
    telemetry.watch_jobs(
        lambda top: job_gauges(app.state.store, top), name_jobs=not reads_need_token
    )
    telemetry.watch_sessions(lambda: session_figures(app))


def add_routes(app: FastAPI) -> None:
    """Adds the routes of every module of :data:`ROUTE_MODULES`, in order, with the app's
    operation ids."""
    for module in ROUTE_MODULES:
        # The routes themselves, not include_router: FastAPI 0.163 wraps each included
        # router in a matcher that every request walks (~10 us a request on this
        # service, measured in-process); none of ours has a prefix or dependencies of
        # its own, so flat routes behave the same.
        app.router.routes.extend(module.router.routes)
    for route in app.router.routes:
        # Module routers were built before the app: give their routes the app's ids too.
        if isinstance(route, APIRoute):
            route.unique_id = route.operation_id or operation_id(route)


def add_middleware(app: FastAPI, settings: Settings, telemetry: Telemetry) -> None:
    """Adds the guards, innermost first: add_middleware wraps, so the last added runs
    first. Call after ``app.state.lifecycle`` is set."""
    app.add_middleware(AnswerLimitMiddleware, max_bytes=settings.max_answer_bytes)
    app.add_middleware(HttpCacheMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    if settings.api_token is not None and settings.api_token.get_secret_value():
        app.add_middleware(
            BearerAuthMiddleware,
            token=settings.api_token.get_secret_value(),
            reads=settings.auth_reads,
        )
    app.add_middleware(
        HeaderLimitMiddleware,
        max_bytes=settings.max_header_bytes,
        max_headers=settings.max_headers,
    )
    app.add_middleware(HeadAsGetMiddleware)
    app.add_middleware(RequestMetricsMiddleware, telemetry=telemetry)
    app.add_middleware(ShutdownMiddleware, lifecycle=app.state.lifecycle)
    add_cors(app, settings.cors_origins)  # 401s and 503s carry CORS headers too
    # Outermost: every answer carries X-Request-ID and every log line of it the id.
    app.add_middleware(RequestIdMiddleware)
