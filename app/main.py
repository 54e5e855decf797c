"""The FastAPI app: ``create_app(settings)``, its lifespan, guards, and ``datarax-serve``.

Request path, outermost first::

    ServerErrorMiddleware  (Starlette; unexpected exceptions -> 500 internal_error)
    RequestMetricsMiddleware  (Prometheus: counts every answer, 401/413 included)
    BearerAuthMiddleware   (401 before anything reads the body)
    BodyLimitMiddleware    (413 before the body is read)
    ExceptionMiddleware -> router -> routes

The lifespan opens the store and starts the runtime process without waiting for it
to be ready (``/health/ready`` says when it is); shutdown stops both. Nothing here
imports JAX or touches a device: the HTTP process never initialises a JAX backend.
"""

from __future__ import annotations

import argparse
import hmac
import logging
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

import anyio.to_thread
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.allocator import keep_freed_memory
from app.errors import PROBLEM_MEDIA_TYPE, install_error_handlers, problem_bytes
from app.multihost import is_leader, run_follower
from app.routes import devices, health, jobs, meshes, metrics, sessions
from app.runtime import RuntimeClient
from app.schemas import (
    FieldError,
    JobMetricsRequest,
    MetricsCollectRequest,
    MetricsReduceRequest,
    Problem,
    StepRequest,
    ValidationProblem,
)
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


# --------------------------------------------------------------------------- guards


async def _send_problem(
    send: Send, status: int, code: str, detail: str, headers: list[tuple[bytes, bytes]] = ()
) -> None:
    body = problem_bytes(status, code, detail)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    """413 ``payload_too_large`` for bodies above ``max_bytes``, without reading them.

    A declared ``Content-Length`` above the limit is refused before a byte of the body is
    read. A body without one (chunked) is read up to the limit and refused as soon as it
    crosses it; under the limit it is replayed to the app. Reads are also counted for
    declared lengths, as a second line of defence.
    """

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self, size: str) -> str:
        return (
            f"request body of {size} exceeds the limit of {self.max_bytes} bytes "
            "(DATARAX_MAX_BODY_MB); send less, or npz-compress large arrays"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                await _send_problem(send, 400, "bad_request", "Content-Length is not a number")
                return
            if length > self.max_bytes:
                await _send_problem(send, 413, "payload_too_large", self._too_large(f"{length}"))
                return
            await self.app(scope, self._counting(receive), send)
            return
        if b"chunked" not in headers.get(b"transfer-encoding", b"").lower():
            await self.app(scope, receive, send)  # no body
            return
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # disconnect: let the app see it
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                await _send_problem(
                    send, 413, "payload_too_large", self._too_large(f"more than {total} bytes")
                )
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _counting(self, receive: Receive) -> Receive:
        total = 0

        async def counted() -> Message:
            nonlocal total
            message = await receive()
            if message["type"] == "http.request":
                total += len(message.get("body", b""))
                if total > self.max_bytes:
                    # Only reachable if the server let more than Content-Length through.
                    raise RuntimeError("request body exceeded its declared Content-Length")
            return message

        return counted


class BearerAuthMiddleware:
    """401 ``unauthorized`` for mutating requests without the bearer token.

    Runs before the body is read; compares in constant time (``hmac.compare_digest``).
    """

    MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})

    def __init__(self, app: ASGIApp, token: str):
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") in self.MUTATING:
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                detail = (
                    "this request needs Authorization: Bearer <token> (DATARAX_API_TOKEN)"
                    if not given
                    else "the bearer token is not valid"
                )
                await _send_problem(
                    send,
                    401,
                    "unauthorized",
                    detail,
                    [(b"www-authenticate", b'Bearer realm="datarax"')],
                )
                return
        await self.app(scope, receive, send)


# ------------------------------------------------------------------------------ app


def _openapi(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """OpenAPI with the problem and manually-validated body schemas in components."""

    def build() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title,
            version=app.version,
            description=app.description,
            routes=app.routes,
            tags=app.openapi_tags,
        )
        models = [
            (m, "validation")
            for m in (
                Problem,
                ValidationProblem,
                FieldError,
                MetricsReduceRequest,
                MetricsCollectRequest,
                JobMetricsRequest,
                StepRequest,
            )
        ]
        _, extra = models_json_schema(models, ref_template="#/components/schemas/{model}")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name, definition in extra.get("$defs", {}).items():
            components.setdefault(name, definition)
        # FastAPI documents its own 422 body on every operation with parameters; ours is a
        # problem document.
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                responses = operation.get("responses", {})
                if "422" in responses:
                    responses["422"] = {
                        "description": "validation_error, invalid_json or a domain code",
                        "content": {
                            PROBLEM_MEDIA_TYPE: {
                                "schema": {"$ref": "#/components/schemas/ValidationProblem"}
                            }
                        },
                    }
        for unused in ("HTTPValidationError", "ValidationError"):
            components.pop(unused, None)
        app.openapi_schema = schema
        return schema

    return build


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
        rt = (
            runtime
            if runtime is not None
            else RuntimeClient(settings, command_modules=("app.training",))
        )
        app.state.store = store
        app.state.runtime = rt
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
    for module in (health, metrics, jobs, devices, meshes, sessions):
        # The routes themselves, not include_router: FastAPI 0.163 wraps each included
        # router in a matcher that every request walks (~10 us a request on this
        # service, measured in-process); none of ours has a prefix or dependencies of
        # its own, so flat routes behave the same.
        app.router.routes.extend(module.router.routes)
    app.openapi = _openapi(app)  # type: ignore[method-assign]

    # add_middleware wraps: the last added runs first.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    if settings.api_token is not None and settings.api_token.get_secret_value():
        app.add_middleware(BearerAuthMiddleware, token=settings.api_token.get_secret_value())
    app.add_middleware(RequestMetricsMiddleware, telemetry=telemetry)
    return app


# ------------------------------------------------------------------------------ CLI


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="datarax-serve",
        description="Run the datarax mesh service. Flags override DATARAX_* variables.",
    )
    parser.add_argument("--host", help="bind address (DATARAX_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (DATARAX_PORT, default 8000)")
    parser.add_argument("--db", help="SQLite database file (DATARAX_DB)")
    parser.add_argument("--coordinator", help="JAX coordinator HOST:PORT (multi-host)")
    parser.add_argument("--num-processes", type=int, help="JAX processes in the cluster")
    parser.add_argument("--process-id", type=int, help="this host's JAX process id")
    parser.add_argument(
        "--distributed",
        action="store_true",
        default=None,
        help="let jax.distributed.initialize() detect the cluster (SLURM, Kubernetes)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn log level",
    )
    return parser.parse_args(argv)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """``Settings`` from the environment, overridden by the flags that were given."""
    overrides = {
        key: value
        for key, value in {
            "host": args.host,
            "port": args.port,
            "db": args.db,
            "coordinator": args.coordinator,
            "num_processes": args.num_processes,
            "process_id": args.process_id,
            "distributed": args.distributed,
        }.items()
        if value is not None
    }
    return Settings(**overrides)


def cli(argv: list[str] | None = None) -> None:
    """Entry point of ``datarax-serve``."""
    import uvicorn

    args = parse_args(argv)
    settings = settings_from_args(args)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if not is_leader(settings):
        # Processes other than 0 serve no HTTP: they only keep their runtime in the group.
        sys.exit(run_follower(settings))
    # Large bodies: reuse freed heap memory instead of page-faulting fresh mmap pages
    # (see app/allocator.py); keeps up to ~4 bodies' worth of freed memory.
    keep_freed_memory(max(256 * 1024 * 1024, 4 * settings.max_body_bytes))
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=args.log_level,
        proxy_headers=False,
        timeout_graceful_shutdown=10,
        # C parser and event loop (both dependencies): h11's pure-Python parser and the
        # asyncio loop cost more per request than most handlers.
        http="httptools",
        loop="uvloop",
    )


if __name__ == "__main__":
    cli()
