"""The FastAPI app: ``create_app(settings)`` and its lifespan.

The lifespan opens the store and starts the runtime process without waiting for it to be
ready (``/health/ready`` says when it is); shutdown stops both. Nothing here imports JAX
or touches a device: the HTTP process never initialises a JAX backend. The guards and
error handlers are :mod:`app.middleware`; the command line is :mod:`app.cli`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

import anyio.to_thread
from fastapi import FastAPI

from app.middleware import BearerAuthMiddleware, BodyLimitMiddleware, install_error_handlers
from app.openapi import openapi_builder
from app.routes import (
    devices,
    hardware,
    health,
    jobs,
    meshes,
    metrics,
    recommendations,
    sessions,
)
from app.runtime_client import RuntimeClient
from app.services.sessions import SessionService
from app.settings import Settings
from app.store import Store
from app.telemetry import RequestMetricsMiddleware, Telemetry

log = logging.getLogger("datarax.app")

API_DESCRIPTION = """\
Plans JAX device meshes (live on this service's devices, or abstract for any cluster
size), reduces stacked per-device metric arrays, and keeps plans and job metric
history in SQLite.

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


class _Runtime(Protocol):
    ready: bool
    restarts: int
    pid: int | None

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def device_info(self) -> dict[str, Any] | None: ...


# ------------------------------------------------------------------------------ app


def create_app(settings: Settings | None = None, *, runtime: _Runtime | None = None) -> FastAPI:
    """Builds the service.

    Args:
      settings: service settings (default: from ``DATARAX_*`` environment variables).
      runtime: a device runtime to use instead of spawning ``RuntimeClient(settings)``
        (tests pass a stand-in).

    Returns:
      The FastAPI app; its lifespan opens the store and starts the runtime.
    """
    settings = settings or Settings()
    telemetry = Telemetry()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = Store(settings.db)
        await anyio.to_thread.run_sync(store.open)
        rt = runtime if runtime is not None else RuntimeClient(settings)
        app.state.store = store
        app.state.runtime = rt
        app.state.sessions = SessionService(store, rt, settings)
        try:
            await rt.start()
            log.info("datarax service up (database %s)", settings.db)
            yield
        finally:
            try:
                await rt.stop()
            finally:
                store.close()

    app = FastAPI(
        title="datarax mesh service",
        version="1.0.0",
        description=API_DESCRIPTION,
        lifespan=lifespan,
        openapi_tags=[
            {"name": "meshes", "description": "mesh plans: live and abstract"},
            {"name": "sessions", "description": "sharded training steps on live meshes"},
            {"name": "metrics", "description": "reductions of stacked per-device metrics"},
            {"name": "jobs", "description": "per-job metric history"},
            {"name": "devices", "description": "the runtime's devices"},
            {"name": "hardware", "description": "hardware catalog and mesh recommendations"},
            {"name": "health", "description": "liveness, readiness, Prometheus"},
        ],
    )
    app.state.settings = settings
    app.state.telemetry = telemetry
    app.state.runtime = runtime
    telemetry.watch_runtime(
        lambda: int(getattr(app.state.runtime, "restarts", 0) or 0),
        lambda: bool(getattr(app.state.runtime, "ready", False)),
    )
    install_error_handlers(app)
    for module in (
        health,
        metrics,
        jobs,
        devices,
        meshes,
        sessions,
        hardware,
        recommendations,
    ):
        # The routes themselves, not include_router: FastAPI 0.163 wraps each included
        # router in a matcher that every request walks (~10 us a request on this
        # service, measured in-process); none of ours has a prefix or dependencies of
        # its own, so flat routes behave the same.
        app.router.routes.extend(module.router.routes)
    app.openapi = openapi_builder(app)  # type: ignore[method-assign]

    # add_middleware wraps: the last added runs first.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    if settings.api_token is not None and settings.api_token.get_secret_value():
        app.add_middleware(BearerAuthMiddleware, token=settings.api_token.get_secret_value())
    app.add_middleware(RequestMetricsMiddleware, telemetry=telemetry)
    return app
