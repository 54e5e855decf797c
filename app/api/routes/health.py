"""Operational endpoints: liveness, readiness and the Prometheus exposition."""

from __future__ import annotations

import anyio.to_thread
import orjson
from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.exposition import choose_encoder
from starlette.responses import Response

from app.api.deps import RuntimeDep, StoreDep, TelemetryDep
from app.api.openapi import problem_responses
from app.api.routing import BytesResponse, answer_response
from app.codecs.media import JSON_MEDIA_TYPE
from app.core.errors import NotReady, StorageFull, StorageUnavailable, WorkerLost
from app.storage.db import RETRY_AFTER_S
from datarax.answers.health import Liveness, Readiness

router = APIRouter(tags=["health"])

_LIVE_BODY = orjson.dumps(Liveness().to_json())


@router.get(
    "/health/live",
    response_class=Response,
    summary="Liveness",
    responses={200: {"model": Liveness, "description": "the HTTP process serves"}},
)
async def check_liveness() -> Response:
    """Always 200 while the HTTP process serves requests."""
    return BytesResponse(_LIVE_BODY, JSON_MEDIA_TYPE)


@router.get(
    "/health/ready",
    response_class=Response,
    summary="Readiness",
    responses={
        200: {"model": Readiness, "description": "ready"},
        **problem_responses(503, 507),
    },
)
async def check_readiness(store: StoreDep, runtime: RuntimeDep) -> Response:
    """200 when the store takes writes and the device runtime (every process) is up.

    503 ``not_ready`` while the service is still starting, ``worker_lost`` after the
    runtime died (it is being restarted). While the database cannot take writes it is
    507 ``storage_full`` (a full disk) or 503 ``storage_unavailable`` (a read-only or
    failing file, directory or WAL), with ``store`` saying which, ``store_reason``
    SQLite's error, ``store_fault_since`` when it began and ``store_checked_at``
    when a write last found it; it turns 200 again by itself
    once a write succeeds (the store probes with a tiny write at most every
    ``app.storage.db.PROBE_INTERVAL_S`` when nothing else wrote). ``runtime_pid`` is the
    runtime process's pid.
    """
    extra = {"runtime_pid": runtime.pid, "runtime_restarts": runtime.restarts}
    if not store.is_open:
        raise NotReady("the database is not open", extra={"store": "closed", **extra})
    fault = await anyio.to_thread.run_sync(store.health)
    if fault is not None:
        store_extra = {
            "store": fault.kind,
            "store_reason": fault.reason,
            "store_fault_since": fault.since,
            "store_checked_at": fault.checked_at,
            **extra,
        }
        if fault.kind == "full":
            raise StorageFull(
                f"the database disk is full ({store.where}); writes answer 507 until space is "
                "freed",
                extra=store_extra,
            )
        raise StorageUnavailable(
            f"the database cannot take writes ({store.where}: {fault.reason}); writes answer "
            "503 until it can",
            extra=store_extra,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    if not runtime.ready:
        if runtime.pid is None or runtime.restarts > 0:
            raise WorkerLost(
                "the device runtime was lost and is restarting; device requests answer 503 "
                "until it is back",
                extra=extra,
            )
        raise NotReady("the device runtime is starting", extra=extra)
    return answer_response(
        Readiness("ready", runtime_pid=runtime.pid, runtime_restarts=runtime.restarts, store="ok")
    )


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={
        200: {
            "content": {
                CONTENT_TYPE_LATEST: {
                    "example": "# HELP datarax_session_steps_total Training steps run\n"
                    "# TYPE datarax_session_steps_total counter\n"
                    "datarax_session_steps_total 1200.0\n"
                },
                "application/openmetrics-text": {},
            },
            "description": "text exposition, or OpenMetrics when the Accept header asks",
        }
    },
)
async def get_prometheus_metrics(request: Request, telemetry: TelemetryDep) -> Response:
    """The service's counters plus the HTTP process's own (CPU, memory, open files), in
    the Prometheus text format or OpenMetrics, negotiated on Accept by prometheus-client."""
    await telemetry.refresh()  # per-job gauges, read from the store in a thread
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    return Response(encoder(telemetry.registry), media_type=content_type)
