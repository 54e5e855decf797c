"""``POST /v1/metrics/reduce`` and ``/v1/metrics/collect``: stacked per-device arrays.

Bodies are JSON (nested lists or OIP tensors) or ``application/x-npz`` (options in the
query string, weights as the array ``_weights``). The body is read here and dispatched on
its media type, so the request models are validated by hand and declared in the OpenAPI
document through ``openapi_extra``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any

import anyio.to_thread
import numpy as np
from fastapi import APIRouter, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from app.deps import (
    JSON_MEDIA_TYPE,
    NPZ_MEDIA_TYPE,
    BearerDoc,
    SettingsDep,
    TelemetryDep,
    is_json_media,
    media_type,
)
from app.errors import InvalidJson, UnsupportedMediaType
from app.metrics_io import (
    decode_json_metrics,
    decode_weights,
    load_npz,
    metrics_to_json,
    parse_reduce_query,
    split_npz_metrics,
)
from app.schemas import (
    METRICS_REQUEST_EXAMPLE,
    CollectResponse,
    MetricsCollectRequest,
    MetricsReduceRequest,
    ReduceResponse,
    problem_responses,
)
from datarax.distributed.metrics import collect_from_devices, reduce_custom

router = APIRouter(tags=["metrics"])

NanPolicyQuery = Annotated[
    str | None,
    Query(description="npz bodies only: propagate (default), omit or raise"),
]
ReduceQuery = Annotated[
    str | None,
    Query(
        description="npz bodies only: per-metric ops, e.g. loss:mean,step:max",
        examples=["loss:mean,step:max"],
    ),
]


@dataclass
class MetricsInput:
    """A decoded metrics request."""

    metrics: dict[str, np.ndarray]
    reduce: dict[str, str]
    weights: np.ndarray | None
    nan_policy: str
    step: int | None = None


def request_body_openapi(schema_name: str, example: dict[str, Any]) -> dict[str, Any]:
    """``openapi_extra`` declaring a JSON-or-npz request body."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                JSON_MEDIA_TYPE: {
                    "schema": {"$ref": f"#/components/schemas/{schema_name}"},
                    "example": example,
                },
                NPZ_MEDIA_TYPE: {
                    "schema": {"type": "string", "format": "binary"},
                    "description": "np.savez archive: one array per metric, weights as "
                    "'_weights'; options in the query string",
                },
            },
        }
    }


def _validation_error(err: ValidationError) -> RequestValidationError:
    errors = []
    for entry in err.errors(include_url=False):
        entry = dict(entry)
        entry["loc"] = ("body", *entry.get("loc", ()))
        errors.append(entry)
    return RequestValidationError(errors)


def _parse_json_model[M: BaseModel](body: bytes, model: type[M]) -> M:
    if not body:
        raise RequestValidationError(
            [{"loc": ("body",), "msg": "Field required", "type": "missing", "input": None}]
        )
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InvalidJson(
            f"request body is not valid JSON ({err}); send a JSON object with "
            "Content-Type: application/json"
        ) from None
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise _validation_error(err) from None


async def read_metrics_request(
    request: Request,
    model: type[MetricsReduceRequest] | type[MetricsCollectRequest],
    *,
    max_bytes: int,
    reduce_query: str | None = None,
    nan_policy_query: str | None = None,
    step_query: int | None = None,
) -> MetricsInput:
    """Reads and decodes a JSON or npz metrics body.

    Raises:
      UnsupportedMediaType, InvalidJson, RequestValidationError, InvalidNpz,
      InvalidTensor, RaggedArray, UnsupportedDatatype, PayloadTooLarge.
    """
    media = media_type(request)
    body = await request.body()
    if is_json_media(media):
        parsed = _parse_json_model(body, model)
        metrics = await anyio.to_thread.run_sync(lambda: decode_json_metrics(parsed.metrics))
        return MetricsInput(
            metrics=metrics,
            reduce=dict(getattr(parsed, "reduce", {}) or {}),
            weights=decode_weights(getattr(parsed, "weights", None)),
            nan_policy=getattr(parsed, "nan_policy", "propagate"),
            step=getattr(parsed, "step", None),
        )
    if media == NPZ_MEDIA_TYPE:
        arrays = await anyio.to_thread.run_sync(lambda: load_npz(body, max_bytes=max_bytes))
        metrics, weights = split_npz_metrics(arrays)
        return MetricsInput(
            metrics=metrics,
            reduce=parse_reduce_query(reduce_query),
            weights=weights,
            nan_policy=nan_policy_query or "propagate",
            step=step_query,
        )
    raise UnsupportedMediaType(
        f"Content-Type {request.headers.get('content-type')!r} is not accepted; send "
        f"{JSON_MEDIA_TYPE} or {NPZ_MEDIA_TYPE}"
    )


def reduce_metrics(data: MetricsInput) -> tuple[dict[str, Any], int]:
    """Reduces over the device axis; returns (JSON-ready reduced values, device count).

    Raises:
      MetricsError: with the library's codes.
    """
    reduced = reduce_custom(
        data.metrics, reduce_fn=data.reduce, weights=data.weights, nan_policy=data.nan_policy
    )
    num_devices = next(
        (int(v.shape[0]) for v in data.metrics.values() if getattr(v, "ndim", 0) >= 1), 0
    )
    return metrics_to_json(reduced), num_devices


def _json(value: Any, status: int = 200) -> Response:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return Response(text, status_code=status, media_type=JSON_MEDIA_TYPE)


@router.post(
    "/v1/metrics/reduce",
    summary="Reduce stacked per-device metrics",
    response_class=Response,
    dependencies=[BearerDoc],
    openapi_extra=request_body_openapi("MetricsReduceRequest", METRICS_REQUEST_EXAMPLE),
    responses={
        200: {"model": ReduceResponse, "description": "reduced values"},
        **problem_responses(401, 413, 415, 422),
    },
)
async def reduce_endpoint(
    request: Request,
    settings: SettingsDep,
    telemetry: TelemetryDep,
    reduce: ReduceQuery = None,
    nan_policy: NanPolicyQuery = None,
) -> Response:
    """Reduces every metric over its leading (device) axis: ``[n_devices]`` gives a
    scalar, ``[n_devices, k]`` a list of k. Ops ``mean`` (weighted with ``weights``),
    ``sum``, ``max``, ``min``; unlisted metrics use ``mean``. Non-finite results are
    ``null`` (JSON has no NaN).

    422 codes: ``validation_error``, ``invalid_json``, ``invalid_tensor``,
    ``ragged_array``, ``unsupported_datatype``, ``invalid_npz``, ``unknown_reduce_op``,
    ``unknown_nan_policy``, ``unknown_metric``, ``device_count_mismatch``,
    ``empty_metrics``, ``weights_mismatch``, ``invalid_weights``, ``non_finite_values``.
    """
    data = await read_metrics_request(
        request,
        MetricsReduceRequest,
        max_bytes=settings.max_body_bytes,
        reduce_query=reduce,
        nan_policy_query=nan_policy,
    )
    reduced, num_devices = await anyio.to_thread.run_sync(lambda: reduce_metrics(data))
    telemetry.reductions.labels(endpoint="reduce").inc()
    return _json({"reduced": reduced, "num_devices": num_devices})


def collect_metrics(data: MetricsInput) -> list[dict[str, Any]]:
    """Splits stacked metrics into per-device JSON-ready values."""
    per_device = collect_from_devices(data.metrics)
    return [{"device": i, "metrics": metrics_to_json(m)} for i, m in enumerate(per_device)]


@router.post(
    "/v1/metrics/collect",
    summary="Split stacked metrics per device",
    response_class=Response,
    dependencies=[BearerDoc],
    openapi_extra=request_body_openapi(
        "MetricsCollectRequest", {"metrics": METRICS_REQUEST_EXAMPLE["metrics"]}
    ),
    responses={
        200: {"model": CollectResponse, "description": "per-device values"},
        **problem_responses(401, 413, 415, 422),
    },
)
async def collect_endpoint(
    request: Request, settings: SettingsDep, telemetry: TelemetryDep
) -> Response:
    """``{"devices": [{"device": i, "metrics": {name: value}}]}``: entry i holds every
    metric's ``[i]`` slice. Non-finite values are ``null``."""
    data = await read_metrics_request(
        request, MetricsCollectRequest, max_bytes=settings.max_body_bytes
    )
    devices = await anyio.to_thread.run_sync(lambda: collect_metrics(data))
    telemetry.reductions.labels(endpoint="collect").inc()
    return _json({"devices": devices})
