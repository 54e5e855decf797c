"""The OpenAPI document: its builder, and the pieces routes declare their operations with.

Routes that read their body themselves (JSON or npz) declare it with
:func:`request_body_openapi`; routes that skip FastAPI's parameter handling declare their
query parameters with :func:`optional_query_doc`, exactly as FastAPI would write them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import FastAPI, Path, Query
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from app.codecs.media import JSON_MEDIA_TYPE, NPZ_MEDIA_TYPE
from app.core.errors import PROBLEM_MEDIA_TYPE
from app.schemas.jobs import JobBatchRequest, JobMetricsRequest
from app.schemas.metrics import (
    NESTED_NUMBER_SCHEMA,
    MetricsCollectRequest,
    MetricsReduceRequest,
)
from app.schemas.problems import FieldError, Problem, ValidationProblem
from app.schemas.sessions import StepRequest

NAN_POLICY_QUERY = "npz bodies only: propagate (default), omit or raise"
REDUCE_QUERY = "npz bodies only: per-metric ops, e.g. loss:mean,step:max"
REDUCE_QUERY_EXAMPLES = ["loss:mean,step:max"]

NanPolicyQuery = Annotated[str | None, Query(description=NAN_POLICY_QUERY)]
ReduceQuery = Annotated[str | None, Query(description=REDUCE_QUERY, examples=REDUCE_QUERY_EXAMPLES)]


MeshId = Annotated[
    str,
    Path(
        description="plan id, e.g. m_01J...",
        max_length=64,
        examples=["m_01JABCDEFGHJKMNPQRSTVWXYZ0"],
    ),
]
"""The ``{mesh_id}`` path parameter of every route under a plan."""


def optional_query_doc(
    name: str, description: str, examples: list[str] | None = None
) -> dict[str, Any]:
    """The OpenAPI entry FastAPI writes for ``Annotated[str | None, Query(...)] = None``."""
    schema: dict[str, Any] = {
        "anyOf": [{"type": "string"}, {"type": "null"}],
        "description": description,
        "title": name.replace("_", " ").title(),
    }
    if examples:
        schema["examples"] = examples
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }


def request_body_openapi(schema_name: str, example: dict[str, Any]) -> dict[str, Any]:
    """``openapi_extra`` declaring a JSON-or-npz request body."""
    return {
        "requestBody": {
            "required": True,
            "description": "JSON, or an np.savez archive (application/x-npz): one array per "
            "metric, weights as '_weights', options in the query string",
            "content": {
                JSON_MEDIA_TYPE: {
                    "schema": {"$ref": f"#/components/schemas/{schema_name}"},
                    "example": example,
                },
                NPZ_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}},
            },
        }
    }


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for the given problem statuses."""
    descriptions = {
        401: "missing or wrong bearer token (code unauthorized)",
        404: "not found",
        409: "conflict",
        413: "request body too large (payload_too_large)",
        415: "body is neither JSON nor application/x-npz (unsupported_media_type)",
        422: "validation_error, invalid_json or a domain code",
        503: "device runtime unavailable (worker_lost) or starting (not_ready)",
        504: "device command timed out (step_timeout)",
    }
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        name = "ValidationProblem" if status == 422 else "Problem"
        out[status] = {
            "description": descriptions.get(status, "error"),
            "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": f"#/components/schemas/{name}"}}},
        }
    return out


def openapi_builder(app: FastAPI) -> Callable[[], dict[str, Any]]:
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
        models: list[tuple[type[BaseModel], JsonSchemaMode]] = [
            (m, "validation")
            for m in (
                Problem,
                ValidationProblem,
                FieldError,
                MetricsReduceRequest,
                MetricsCollectRequest,
                JobMetricsRequest,
                JobBatchRequest,
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
        components.setdefault("NestedNumber", NESTED_NUMBER_SCHEMA)
        for unused in ("HTTPValidationError", "ValidationError"):
            components.pop(unused, None)
        _declare_auth(schema, app.state.settings)
        _standard_bounds(schema)
        app.openapi_schema = schema
        return schema

    return build


_BOUND_KEYWORDS = {
    "ge": "minimum",
    "le": "maximum",
    "gt": "exclusiveMinimum",
    "lt": "exclusiveMaximum",
}


def _standard_bounds(node: Any) -> None:
    """Pydantic writes ``Field(ge=..)`` on a validated ``JsonInt`` inside a list or an
    optional as ``{"ge": 1}``, which JSON Schema ignores (the document then allowed 0 where
    the server refuses it); rename those keys to ``minimum``/``maximum``/``exclusive*``."""
    if isinstance(node, dict):
        if node.get("type") in ("integer", "number"):
            for raw, keyword in _BOUND_KEYWORDS.items():
                if raw in node:
                    node.setdefault(keyword, node.pop(raw))
        for value in node.values():
            _standard_bounds(value)
    elif isinstance(node, list):
        for value in node:
            _standard_bounds(value)


def _declare_auth(schema: dict[str, Any], settings: Any) -> None:
    """Says what the server does: no token, no security and no 401s; a token, bearer auth
    on writes (and on every ``/v1`` read with ``DATARAX_AUTH_READS``)."""
    token = settings.api_token
    enforced = token is not None and bool(token.get_secret_value())
    schemes = schema.get("components", {}).get("securitySchemes", {})
    scheme_name = next(iter(schemes), None)
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            if not enforced:
                operation.pop("security", None)
                operation.get("responses", {}).pop("401", None)
            elif settings.auth_reads and method == "get" and path.startswith("/v1/"):
                if scheme_name is not None:
                    operation["security"] = [{scheme_name: []}]
                operation.setdefault("responses", {}).update(
                    {str(k): v for k, v in problem_responses(401).items()}
                )
    if not enforced:
        schema.get("components", {}).pop("securitySchemes", None)
