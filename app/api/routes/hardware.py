"""The hardware catalog over HTTP: ``GET /v1/hardware`` and ``GET /v1/hardware/{name}``.

HTTP only; :mod:`app.services.hardware` does the work."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from starlette.responses import Response

from app.api.openapi import problem_responses
from app.api.routing import answer_response
from app.services import hardware
from datarax.answers.catalog import HardwareEntry, HardwareList

router = APIRouter(tags=["hardware"])

HardwareName = Annotated[
    str, Path(description="catalog name, e.g. tpu-v5e", max_length=64, examples=["tpu-v5e"])
]


@router.get(
    "/v1/hardware",
    summary="List hardware",
    response_class=Response,
    responses={
        200: {
            "model": HardwareList,
            "description": "every catalog entry",
            # One real entry, read from the catalog.
            "content": {
                "application/json": {
                    "example": {"items": [e.to_json() for e in hardware.list_hardware().items[:1]]}
                }
            },
        }
    },
)
async def list_hardware() -> Response:
    """``{"items": [...]}``: each entry's HBM, peak bf16 FLOP/s, devices per host, fast
    (ICI / NVLink) and slow (DCN / InfiniBand) link bandwidths, TPU topologies, and the
    public source of every figure in ``sources``."""
    return answer_response(hardware.list_hardware())


@router.get(
    "/v1/hardware/{name}",
    summary="Read one hardware entry",
    response_class=Response,
    responses={
        200: {"model": HardwareEntry, "description": "the catalog entry"},
        **problem_responses(404),
    },
)
async def get_hardware(name: HardwareName) -> Response:
    """One catalog entry. 404 when the catalog has no such name."""
    return answer_response(hardware.hardware_entry(name))
