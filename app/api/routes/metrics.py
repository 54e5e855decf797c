"""``POST /v1/metrics/reduce`` and ``/v1/metrics/collect``: HTTP only (app.services.metrics
does the work).

Bodies are JSON (nested lists or OIP tensors) or ``application/x-npz`` (options in the
query string, weights as the array ``_weights``). The body is read here and dispatched on
its media type, so the request models are validated by the service and declared in the
OpenAPI document through ``openapi_extra``. Small bodies are handled on the event loop,
large ones in one worker thread (``app.api.routing.run_for_body``). Answers are written by
orjson straight from numpy, or, for a reduce whose Accept header prefers it, as an npz
archive. Both routes are ``RequestOnlyRoute`` s (see ``app.api.routing``): FastAPI's request
handler is skipped.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.api.deps import BEARER_SCHEME
from app.api.openapi import (
    NAN_POLICY_QUERY,
    REDUCE_QUERY,
    REDUCE_QUERY_EXAMPLES,
    optional_query_doc,
    problem_responses,
    request_body_openapi,
)
from app.api.routing import BytesResponse, RequestOnlyRoute, accepts_npz, media_type, read_body
from app.codecs.media import JSON_MEDIA_TYPE, NPZ_MEDIA_TYPE, is_json_media
from app.codecs.npz import encode_npz
from app.core.threads import run_for_body
from app.schemas.metrics import (
    METRICS_REQUEST_EXAMPLE,
    MetricsCollectRequest,
    MetricsReduceRequest,
)
from app.services.metrics import (
    NUM_DEVICES_ARRAY,
    SMALL_BODY_BYTES,
    decode_metrics_body,
    encode_collect,
    encode_reduced,
    reduce_metrics,
    reduce_small_json,
    reduced_npz_arrays,
)
from datarax.answers.metrics import CollectAnswer, ReduceAnswer

# Both routes take only the Request: see app.api.routing for what that saves.
router = APIRouter(tags=["metrics"], route_class=RequestOnlyRoute)


def _raw_content_type(request: Request, media: str | None) -> str | None:
    """The Content-Type header as sent, for the 415 message only (read lazily)."""
    if is_json_media(media) or media == NPZ_MEDIA_TYPE:
        return None
    return request.headers.get("content-type")


# The two hot metric routes take only the Request. FastAPI's per-request dependency
# solving for settings, telemetry, two query parameters and the bearer scheme costs about
# 60 us, more than a small reduction; the parameters and the security requirement are
# declared in openapi_extra instead, exactly as FastAPI would write them. RequestOnlyRoute
# then skips the rest of FastAPI's handler (another ~40 us under load).
_NO_DI_SECURITY: dict[str, Any] = {"security": [{BEARER_SCHEME: []}]}

# Both answers of the reduce route depend on Accept (RFC 9110 section 12.5.5).
_VARY_ACCEPT = ((b"vary", b"Accept"),)


@router.post(
    "/v1/metrics/reduce",
    summary="Reduce stacked per-device metrics",
    operation_id="reduce_metrics",  # the endpoint function's name is taken by the service
    response_class=Response,
    openapi_extra={
        "parameters": [
            optional_query_doc("reduce", REDUCE_QUERY, REDUCE_QUERY_EXAMPLES),
            optional_query_doc("nan_policy", NAN_POLICY_QUERY),
        ],
        **_NO_DI_SECURITY,
        **request_body_openapi("MetricsReduceRequest", METRICS_REQUEST_EXAMPLE),
    },
    responses={
        200: {
            "model": ReduceAnswer,
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
    ``integer_overflow`` (an integer sum whose exact value does not fit int64/uint64:
    integer sums are exact or refused, never wrapped), ``reserved_metric_name`` (with an npz
    answer: a metric named ``_num_devices``, or a name with a NUL or control character).

    Float sums and means are finite wherever the true value is (the mean of ``[1e308,
    1e308]`` is ``1e308``), and weighted means do not depend on the weights' scale.
    """
    state = request.app.state
    body = await read_body(request)
    media = media_type(request)
    content_type = _raw_content_type(request, media)
    # Options travel in the query string only with npz bodies (JSON ignores it).
    query = request.query_params if media == NPZ_MEDIA_TYPE else {}

    npz_answer = accepts_npz(request)
    if not npz_answer and len(body) <= SMALL_BODY_BYTES and is_json_media(media):
        small = reduce_small_json(body)  # microseconds: inline, no thread
        if small is not None:
            state.telemetry.count_reduction("reduce")
            return BytesResponse(small, JSON_MEDIA_TYPE, headers=_VARY_ACCEPT)

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
            return encode_npz(reduced_npz_arrays(reduced, num_devices))
        return encode_reduced(reduced, num_devices)

    content = await run_for_body(work, len(body))
    state.telemetry.count_reduction("reduce")
    return BytesResponse(
        content, NPZ_MEDIA_TYPE if npz_answer else JSON_MEDIA_TYPE, headers=_VARY_ACCEPT
    )


@router.post(
    "/v1/metrics/collect",
    summary="Split stacked metrics per device",
    operation_id="collect_metrics",
    response_class=Response,
    openapi_extra={
        **_NO_DI_SECURITY,
        **request_body_openapi(
            "MetricsCollectRequest", {"metrics": METRICS_REQUEST_EXAMPLE["metrics"]}
        ),
    },
    responses={
        200: {"model": CollectAnswer, "description": "per-device values"},
        **problem_responses(401, 413, 415, 422),
    },
)
async def collect_endpoint(request: Request) -> Response:
    """``{"devices": [{"device": i, "metrics": {name: value}}]}``: entry i holds every
    metric's ``[i]`` slice. Non-finite values are ``null``. An answer that would pass
    ``DATARAX_MAX_ANSWER_MB`` is 422 ``answer_too_large``, refused before it is built."""
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
        return encode_collect(data, max_bytes=state.settings.max_answer_bytes)

    content = await run_for_body(work, len(body))
    state.telemetry.count_reduction("collect")
    return BytesResponse(content, JSON_MEDIA_TYPE)
