"""``POST /v1/metrics/reduce`` and ``/v1/metrics/collect``: stacked per-device arrays.

Bodies are JSON (nested lists or OIP tensors) or ``application/x-npz`` (options in the
query string, weights as the array ``_weights``). The body is read here and dispatched on
its media type, so the request models are validated by hand and declared in the OpenAPI
document through ``openapi_extra``.

Speed: a body in the common form (see ``plain_metrics_fields``) skips pydantic; any other
body is validated by the models, which give every error. Bodies up to
``INLINE_BODY_BYTES`` are decoded, reduced and encoded on the event loop (tens of
microseconds, less than a thread hop costs); larger ones in one worker thread, so the loop
never waits on big arrays. Answers are written by orjson straight from numpy, or, for a
reduce whose Accept header prefers it, as an npz archive (``encode_npz``). Both routes are
``RequestOnlyRoute`` s (see ``app.routing``): FastAPI's request handler is skipped.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import anyio.to_thread
import numpy as np
from fastapi import APIRouter, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from app.deps import (
    BEARER_SCHEME,
    JSON_MEDIA_TYPE,
    NPZ_MEDIA_TYPE,
    accepts_npz,
    is_json_media,
    media_type,
)
from app.errors import InvalidJson, ReservedMetricName, UnsupportedMediaType
from app.metrics_io import (
    NUM_DEVICES_ARRAY,
    decode_json_metrics,
    decode_weights,
    encode_json,
    encode_npz,
    load_npz,
    loads_json,
    parse_reduce_query,
    plain_metrics_fields,
    split_npz_metrics,
)
from app.routing import BytesResponse, RequestOnlyRoute, read_body
from app.schemas import (
    METRICS_REQUEST_EXAMPLE,
    CollectResponse,
    MetricsCollectRequest,
    MetricsReduceRequest,
    ReduceResponse,
    problem_responses,
)
from datarax.distributed.metrics import collect_from_devices, reduce_custom

# Both routes take only the Request: see app.routing for what that saves.
router = APIRouter(tags=["metrics"], route_class=RequestOnlyRoute)

_NAN_POLICY_QUERY = "npz bodies only: propagate (default), omit or raise"
_REDUCE_QUERY = "npz bodies only: per-metric ops, e.g. loss:mean,step:max"
_REDUCE_QUERY_EXAMPLES = ["loss:mean,step:max"]

NanPolicyQuery = Annotated[str | None, Query(description=_NAN_POLICY_QUERY)]
ReduceQuery = Annotated[
    str | None, Query(description=_REDUCE_QUERY, examples=_REDUCE_QUERY_EXAMPLES)
]


def _optional_query_doc(name: str, description: str, examples: list[str] | None = None) -> dict:
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


def _validation_error(err: ValidationError) -> RequestValidationError:
    errors = []
    for entry in err.errors(include_url=False):
        entry = dict(entry)
        entry["loc"] = ("body", *entry.get("loc", ()))
        errors.append(entry)
    return RequestValidationError(errors)


def _loads_body(body: bytes) -> Any:
    if not body:
        raise RequestValidationError(
            [{"loc": ("body",), "msg": "Field required", "type": "missing", "input": None}]
        )
    try:
        return loads_json(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InvalidJson(
            f"request body is not valid JSON ({err}); send a JSON object with "
            "Content-Type: application/json"
        ) from None


def _validate_model[M: BaseModel](data: Any, model: type[M]) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise _validation_error(err) from None


def parse_json_model[M: BaseModel](body: bytes, model: type[M]) -> M:
    return _validate_model(_loads_body(body), model)


INLINE_BODY_BYTES = 64 * 1024
"""Bodies up to this size are handled on the event loop; larger ones in a worker thread."""


async def run_for_body[T](fn: Callable[[], T], body_size: int) -> T:
    """Runs ``fn`` inline for a small body, else in a worker thread (one hop for all)."""
    if body_size <= INLINE_BODY_BYTES:
        return fn()
    return await anyio.to_thread.run_sync(fn)


@functools.cache
def _model_members(model: type[BaseModel]) -> tuple[bool, bool]:
    """(takes reduce/weights/nan_policy, takes step) for a metrics request model."""
    return "reduce" in model.model_fields, "step" in model.model_fields


def _json_metrics_input(body: bytes, model: type[BaseModel]) -> MetricsInput:
    data = _loads_body(body)
    options, step = _model_members(model)
    fields = plain_metrics_fields(data, options=options, step=step)
    if fields is None:
        parsed = _validate_model(data, model)
        fields = {
            "metrics": parsed.metrics,  # type: ignore[attr-defined]
            "reduce": getattr(parsed, "reduce", None) or {},
            "weights": getattr(parsed, "weights", None),
            "nan_policy": getattr(parsed, "nan_policy", "propagate"),
            "step": getattr(parsed, "step", None),
        }
    return MetricsInput(
        metrics=decode_json_metrics(fields["metrics"]),
        reduce=dict(fields["reduce"]),
        weights=decode_weights(fields["weights"]),
        nan_policy=fields["nan_policy"],
        step=fields["step"],
    )


def decode_metrics_body(
    body: bytes,
    media: str | None,
    content_type: str | None,
    model: type[MetricsReduceRequest] | type[MetricsCollectRequest],
    *,
    max_bytes: int,
    reduce_query: str | None = None,
    nan_policy_query: str | None = None,
    step_query: int | None = None,
) -> MetricsInput:
    """Decodes a JSON or npz metrics body (plain function: no I/O).

    Args:
      body: the raw request body.
      media: its media type (``app.deps.media_type``); ``content_type``: the raw header,
        for the 415 message.
      model: the request model a JSON body must satisfy.
      max_bytes: the largest decompressed npz accepted.
      reduce_query, nan_policy_query, step_query: npz bodies' options.

    Raises:
      UnsupportedMediaType, InvalidJson, RequestValidationError, InvalidNpz,
      InvalidTensor, RaggedArray, UnsupportedDatatype, PayloadTooLarge.
    """
    if is_json_media(media):
        return _json_metrics_input(body, model)
    if media == NPZ_MEDIA_TYPE:
        metrics, weights = split_npz_metrics(load_npz(body, max_bytes=max_bytes))
        return MetricsInput(
            metrics=metrics,
            reduce=parse_reduce_query(reduce_query),
            weights=weights,
            nan_policy=nan_policy_query or "propagate",
            step=step_query,
        )
    raise UnsupportedMediaType(
        f"Content-Type {content_type!r} is not accepted; send {JSON_MEDIA_TYPE} or {NPZ_MEDIA_TYPE}"
    )


def reduce_metrics(data: MetricsInput) -> tuple[dict[str, Any], int]:
    """Reduces over the device axis; returns (reduced values, device count).

    The values are numpy scalars and arrays, for ``encode_json``.

    Raises:
      MetricsError: with the library's codes.
    """
    reduced = reduce_custom(
        data.metrics, reduce_fn=data.reduce, weights=data.weights, nan_policy=data.nan_policy
    )
    return reduced, _num_devices(data.metrics)


def _num_devices(metrics: dict[str, np.ndarray]) -> int:
    """The leading (device) axis size; 0 when no metric has one."""
    for value in metrics.values():
        if value.ndim >= 1:
            return int(value.shape[0])
    return 0


def _raw_content_type(request: Request, media: str | None) -> str | None:
    """The Content-Type header as sent, for the 415 message only (read lazily)."""
    if is_json_media(media) or media == NPZ_MEDIA_TYPE:
        return None
    return request.headers.get("content-type")


def _json_response(content: bytes, status: int = 200) -> Response:
    return BytesResponse(content, JSON_MEDIA_TYPE, status)


# The two hot metric routes take only the Request. FastAPI's per-request dependency
# solving for settings, telemetry, two query parameters and the bearer scheme costs about
# 60 us, more than a small reduction; the parameters and the security requirement are
# declared in openapi_extra instead, exactly as FastAPI would write them. RequestOnlyRoute
# then skips the rest of FastAPI's handler (another ~40 us under load).
_NO_DI_SECURITY = {"security": [{BEARER_SCHEME: []}]}

# Both answers of the reduce route depend on Accept (RFC 9110 section 12.5.5).
_VARY_ACCEPT = ((b"vary", b"Accept"),)


@router.post(
    "/v1/metrics/reduce",
    summary="Reduce stacked per-device metrics",
    response_class=Response,
    openapi_extra={
        "parameters": [
            _optional_query_doc("reduce", _REDUCE_QUERY, _REDUCE_QUERY_EXAMPLES),
            _optional_query_doc("nan_policy", _NAN_POLICY_QUERY),
        ],
        **_NO_DI_SECURITY,
        **request_body_openapi("MetricsReduceRequest", METRICS_REQUEST_EXAMPLE),
    },
    responses={
        200: {
            "model": ReduceResponse,
            "description": "reduced values as JSON; with Accept: application/x-npz, an "
            "np.savez archive: one array per metric (0-d for scalars, NaN kept), plus "
            f"'{NUM_DEVICES_ARRAY}'",
            "content": {NPZ_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
        },
        **problem_responses(401, 413, 415, 422),
    },
)
async def reduce_endpoint(request: Request) -> Response:
    """Reduces every metric over its leading (device) axis: ``[n_devices]`` gives a
    scalar, ``[n_devices, k]`` a list of k. Ops ``mean`` (weighted with ``weights``),
    ``sum``, ``max``, ``min``; unlisted metrics use ``mean``. Non-finite results are
    ``null`` (JSON has no NaN).

    With ``Accept: application/x-npz`` the answer is an npz archive instead: one array
    per metric (0-d for scalars, non-finite values kept) and ``_num_devices``. Large
    reductions answer in a fraction of JSON's time and size; errors stay problem+json.

    422 codes: ``validation_error``, ``invalid_json``, ``invalid_tensor``,
    ``ragged_array``, ``unsupported_datatype``, ``invalid_npz``, ``unknown_reduce_op``,
    ``unknown_nan_policy``, ``unknown_metric``, ``device_count_mismatch``,
    ``empty_metrics``, ``weights_mismatch``, ``invalid_weights``, ``non_finite_values``,
    ``reserved_metric_name`` (a metric named ``_num_devices`` with an npz answer).
    """
    state = request.app.state
    body = await read_body(request)
    media = media_type(request)
    content_type = _raw_content_type(request, media)
    # Options travel in the query string only with npz bodies (JSON ignores it).
    query = request.query_params if media == NPZ_MEDIA_TYPE else {}

    def work() -> bytes:
        data = decode_metrics_body(
            body,
            media,
            content_type,
            MetricsReduceRequest,
            max_bytes=state.settings.max_body_bytes,
            reduce_query=query.get("reduce"),
            nan_policy_query=query.get("nan_policy"),
        )
        reduced, num_devices = reduce_metrics(data)
        if npz_answer:
            if NUM_DEVICES_ARRAY in reduced:
                raise ReservedMetricName(
                    f"{NUM_DEVICES_ARRAY!r} names the device count in npz answers; rename "
                    "that metric, or ask for JSON"
                )
            return encode_npz({**reduced, NUM_DEVICES_ARRAY: np.int64(num_devices)})
        return encode_json({"reduced": reduced, "num_devices": num_devices})

    npz_answer = accepts_npz(request)
    content = await run_for_body(work, len(body))
    state.telemetry.count_reduction("reduce")
    return BytesResponse(
        content, NPZ_MEDIA_TYPE if npz_answer else JSON_MEDIA_TYPE, headers=_VARY_ACCEPT
    )


def collect_metrics(data: MetricsInput) -> list[dict[str, Any]]:
    """Splits stacked metrics into per-device values (numpy, for ``encode_json``)."""
    per_device = collect_from_devices(data.metrics)
    return [{"device": i, "metrics": m} for i, m in enumerate(per_device)]


@router.post(
    "/v1/metrics/collect",
    summary="Split stacked metrics per device",
    response_class=Response,
    openapi_extra={
        **_NO_DI_SECURITY,
        **request_body_openapi(
            "MetricsCollectRequest", {"metrics": METRICS_REQUEST_EXAMPLE["metrics"]}
        ),
    },
    responses={
        200: {"model": CollectResponse, "description": "per-device values"},
        **problem_responses(401, 413, 415, 422),
    },
)
async def collect_endpoint(request: Request) -> Response:
    """``{"devices": [{"device": i, "metrics": {name: value}}]}``: entry i holds every
    metric's ``[i]`` slice. Non-finite values are ``null``."""
    state = request.app.state
    body = await read_body(request)
    media = media_type(request)
    content_type = _raw_content_type(request, media)

    def work() -> bytes:
        data = decode_metrics_body(
            body,
            media,
            content_type,
            MetricsCollectRequest,
            max_bytes=state.settings.max_body_bytes,
        )
        return encode_json({"devices": collect_metrics(data)})

    content = await run_for_body(work, len(body))
    state.telemetry.count_reduction("collect")
    return _json_response(content)
