"""``GET /v1/devices``: the runtime's global devices."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from app.api.deps import RuntimeDep
from app.api.openapi import problem_responses
from app.api.routing import answer_response
from app.core.errors import WorkerLost
from datarax.answers.health import Devices

router = APIRouter(tags=["devices"])


@router.get(
    "/v1/devices",
    response_class=Response,
    summary="List devices",
    responses={
        200: {"model": Devices, "description": "the runtime's devices"},
        **problem_responses(503),
    },
)
async def list_devices(runtime: RuntimeDep) -> Response:
    """Platform, process count and index, and every global device (id, kind, process
    index, physical coordinates where the platform has them). 503 ``worker_lost`` while the
    runtime is down."""
    info = runtime.device_info()
    if info is None:
        raise WorkerLost("the device runtime is not ready; retry shortly")
    return answer_response(Devices.from_json(info))
