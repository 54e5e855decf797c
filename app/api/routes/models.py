"""Named models over HTTP: ``GET /v1/models`` and ``GET /v1/models/{name}`` (DESIGN v1.2).

HTTP only; the catalog is :mod:`datarax.specs.named_models`, read through
:mod:`app.services.hardware`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from starlette.responses import Response

from app.api.openapi import problem_responses
from app.api.routing import answer_response
from app.services import hardware
from datarax.answers.catalog import NamedModelEntry, NamedModelList

router = APIRouter(tags=["hardware"])

ModelName = Annotated[
    str,
    Path(description="a named model, e.g. llama3.1-8b", max_length=64, examples=["llama3.1-8b"]),
]


@router.get(
    "/v1/models",
    summary="List named models",
    response_class=Response,
    responses={
        200: {
            "model": NamedModelList,
            "description": "every named model",
            # One real entry, read from the catalog.
            "content": {
                "application/json": {
                    "example": {"items": [e.to_json() for e in hardware.list_models().items[:1]]}
                }
            },
        }
    },
)
async def list_models() -> Response:
    """``{"items": [...]}``: each named model's fields (a ``model`` object as plans,
    recommendations and compile checks take it) and its ``source``. A request names one
    as ``{"name": "llama3.1-8b", ...}``; the other fields override the entry's."""
    return answer_response(hardware.list_models())


@router.get(
    "/v1/models/{name}",
    summary="Read one named model",
    response_class=Response,
    responses={
        200: {"model": NamedModelEntry, "description": "the entry"},
        **problem_responses(404),
    },
)
async def get_model(name: ModelName) -> Response:
    """One named model. 404 ``model_not_found`` when there is no such name."""
    return answer_response(hardware.model_entry(name))
