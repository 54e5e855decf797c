"""Domain errors and the handlers that turn every error into RFC 9457 problem details.

Every 4xx/5xx answer of the service is ``application/problem+json``::

    {"type": "urn:datarax:problem:not_enough_devices", "title": "Not enough devices",
     "status": 422, "detail": "mesh {...} needs 16 devices but only 8 are available",
     "code": "not_enough_devices"}

``code`` is the stable, machine-readable snake_case reason; ``type`` is a URN built
from it (not dereferenceable, but unique per code). Validation errors add ``errors``:
one entry per problem with ``loc`` (the full location, e.g. ``["body", "axes",
"data"]``), ``field`` (the dotted path inside that location, ``"axes.data"``), ``msg``
and ``type``.

Codes produced by the service itself (library codes from ``PlanError`` and
``MetricsError`` pass through unchanged, all 422):

=====  =========================  ================================================
400    ``bad_request``            a request Starlette could not parse
401    ``unauthorized``           missing/wrong bearer token (``WWW-Authenticate``)
404    ``not_found``              no such path
404    ``mesh_not_found``         no stored plan with that id
405    ``method_not_allowed``     path exists, method does not (``Allow`` header)
409    ``plan_not_live``          a device operation on an abstract plan
413    ``payload_too_large``      body (or decompressed npz) above the size limit
415    ``unsupported_media_type`` body neither JSON nor ``application/x-npz``
422    ``validation_error``       schema violation; ``errors`` names the fields
422    ``invalid_json``           body is not parseable JSON
422    ``invalid_tensor``         bad OIP tensor / array (shape vs data, rank 0, ...)
422    ``ragged_array``           nested lists that are not rectangular
422    ``unsupported_datatype``   OIP datatype such as BF16 or BYTES
422    ``invalid_npz``            npz body that cannot be read without pickle
500    ``internal_error``         a bug; the detail never carries a traceback
503    ``worker_lost``            the device runtime died or is restarting
503    ``not_ready``              the service is still starting
504    ``step_timeout``           a device command exceeded ``step_timeout_s``
=====  =========================  ================================================
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import Match

from app.runtime import RuntimeCommandError, RuntimeTimeout, WorkerLost
from datarax.distributed.metrics import MetricsError
from datarax.distributed.planning import PlanError

logger = logging.getLogger("app.errors")

PROBLEM_MEDIA_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:datarax:problem:"


class ServiceError(Exception):
    """Base of every error the service raises on purpose.

    Subclasses fix ``status``, ``code`` and ``title``; instances carry the ``detail``
    (what was received and how to fix it), optional extension members and headers.
    """

    status: int = 500
    code: str = "internal_error"
    title: str = "Internal server error"

    def __init__(
        self,
        detail: str,
        *,
        extra: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        super().__init__(detail)
        self.detail = detail
        self.extra = dict(extra or {})
        self.headers = dict(headers or {})


class BadRequest(ServiceError):
    status, code, title = 400, "bad_request", "Bad request"


class Unauthorized(ServiceError):
    status, code, title = 401, "unauthorized", "Unauthorized"

    def __init__(self, detail: str):
        super().__init__(detail, headers={"WWW-Authenticate": 'Bearer realm="datarax"'})


class MeshNotFound(ServiceError):
    status, code, title = 404, "mesh_not_found", "Mesh plan not found"


class SessionNotFound(ServiceError):
    status, code, title = 404, "session_not_found", "Session not found"


class PlanNotLive(ServiceError):
    status, code, title = 409, "plan_not_live", "Plan is not live"


class PayloadTooLarge(ServiceError):
    status, code, title = 413, "payload_too_large", "Payload too large"


class UnsupportedMediaType(ServiceError):
    status, code, title = 415, "unsupported_media_type", "Unsupported media type"


class InvalidJson(ServiceError):
    status, code, title = 422, "invalid_json", "Malformed JSON body"


class InvalidParameter(ServiceError):
    """A query/body value that fails validation outside the pydantic models."""

    status, code, title = 422, "validation_error", "Request validation failed"

    def __init__(self, loc: Sequence[str | int], msg: str, *, error_type: str = "value_error"):
        entry = _error_entry(loc, msg, error_type)
        super().__init__(f"{_dotted(loc)}: {msg}", extra={"errors": [entry]})


class InvalidTensor(ServiceError):
    status, code, title = 422, "invalid_tensor", "Invalid tensor"


class RaggedArray(ServiceError):
    status, code, title = 422, "ragged_array", "Ragged array"


class UnsupportedDatatype(ServiceError):
    status, code, title = 422, "unsupported_datatype", "Unsupported tensor datatype"


class InvalidNpz(ServiceError):
    status, code, title = 422, "invalid_npz", "Invalid npz body"


class ReservedMetricName(ServiceError):
    status, code, title = 422, "reserved_metric_name", "Reserved metric name"


class WorkerUnavailable(ServiceError):
    status, code, title = 503, "worker_lost", "Device runtime unavailable"


class NotReady(ServiceError):
    status, code, title = 503, "not_ready", "Service not ready"


class StepTimeout(ServiceError):
    status, code, title = 504, "step_timeout", "Device command timed out"


# --------------------------------------------------------------------------- rendering


def _title_from_code(code: str) -> str:
    return code.replace("_", " ").capitalize()


def problem_body(
    status: int, code: str, detail: str, *, title: str | None = None, **extra: Any
) -> dict[str, Any]:
    """The problem-details object (a plain dict)."""
    body = {
        "type": TYPE_PREFIX + code,
        "title": title or _title_from_code(code),
        "status": status,
        "detail": detail,
        "code": code,
    }
    body.update(extra)
    return body


def problem_response(
    status: int,
    code: str,
    detail: str,
    *,
    title: str | None = None,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> Response:
    """An ``application/problem+json`` response."""
    body = problem_body(status, code, detail, title=title, **extra)
    content = json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return Response(content, status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=headers)


def problem_bytes(status: int, code: str, detail: str, **extra: Any) -> bytes:
    """Encoded problem body, for pure ASGI middleware that answers on its own."""
    return json.dumps(problem_body(status, code, detail, **extra), separators=(",", ":")).encode()


def _dotted(loc: Sequence[str | int]) -> str:
    return ".".join(str(part) for part in loc)


def _error_entry(loc: Sequence[str | int], msg: str, error_type: str) -> dict[str, Any]:
    loc = list(loc)
    inner = loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc
    return {"loc": loc, "field": _dotted(inner), "msg": msg, "type": error_type}


def validation_problem(errors: Sequence[Mapping[str, Any]]) -> Response:
    """422 for pydantic/FastAPI errors; malformed JSON is ``invalid_json``."""
    entries = [
        _error_entry(err.get("loc", ()), str(err.get("msg", "")), str(err.get("type", "")))
        for err in errors
    ]
    for err in errors:
        if err.get("type") == "json_invalid":
            reason = (err.get("ctx") or {}).get("error", "JSON decode error")
            position = err.get("loc", ("body", "?"))[-1]
            return problem_response(
                422,
                InvalidJson.code,
                f"request body is not valid JSON ({reason} at character {position}); "
                "send a JSON object with Content-Type: application/json",
                title=InvalidJson.title,
            )
    first = entries[0] if entries else {"loc": [], "msg": "invalid request"}
    more = f" (and {len(entries) - 1} more)" if len(entries) > 1 else ""
    return problem_response(
        422,
        "validation_error",
        f"{_dotted(first['loc'])}: {first['msg']}{more}",
        title="Request validation failed",
        errors=entries,
    )


_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "too_many_requests",
    500: "internal_error",
    503: "service_unavailable",
}


def _status_code_name(status: int) -> str:
    if status in _STATUS_CODES:
        return _STATUS_CODES[status]
    try:
        return HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        return "http_error"


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


# ----------------------------------------------------------------------------- handlers


async def _service_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServiceError)
    return problem_response(
        exc.status, exc.code, exc.detail, title=exc.title, headers=exc.headers, **exc.extra
    )


async def _plan_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, PlanError)
    return problem_response(422, exc.code, exc.message, title="Invalid mesh plan")


async def _metrics_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, MetricsError)
    return problem_response(422, exc.code, exc.message, title="Invalid metrics")


async def _worker_lost(_request: Request, exc: Exception) -> Response:
    detail = str(exc) or "the device runtime is not running; it is being restarted"
    return problem_response(503, "worker_lost", detail, title=WorkerUnavailable.title)


async def _runtime_timeout(_request: Request, exc: Exception) -> Response:
    detail = str(exc) or "the device command did not finish in time"
    return problem_response(504, "step_timeout", detail, title=StepTimeout.title)


async def _runtime_command_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RuntimeCommandError)
    status = int(getattr(exc, "status", 500) or 500)
    code = getattr(exc, "code", None) or _status_code_name(status)
    title = getattr(exc, "title", None) or _title_from_code(code)
    detail = getattr(exc, "detail", None) or str(exc)
    if status >= 500 and code == "internal_error":
        logger.error("runtime command failed: %s", detail)
        detail = "the device runtime failed to run the command; see the service log"
    return problem_response(status, code, detail, title=title)


async def _request_validation(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return validation_problem(exc.errors())


_FASTAPI_BODY_PARSE_ERROR = "There was an error parsing the body"


def _allowed_methods(request: Request) -> str:
    """Every method some route serves on this path (Starlette names only the first route).

    Probes the router with each method: routes may sit inside included routers, so their
    method sets are not all visible from the app.
    """
    allowed = []
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
        probe = {**request.scope, "method": method}
        if any(route.matches(probe)[0] == Match.FULL for route in request.app.router.routes):
            allowed.append(method)
    return ", ".join(allowed)


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    code = _status_code_name(status)
    if status == 400 and exc.detail == _FASTAPI_BODY_PARSE_ERROR:
        # FastAPI's answer to a JSON body it cannot decode (e.g. not UTF-8): the same
        # problem as any other malformed JSON.
        return problem_response(
            422,
            InvalidJson.code,
            "request body is not valid JSON (it could not be decoded); send UTF-8 JSON",
            title=InvalidJson.title,
        )
    if status == 404:
        detail = "no such path; see /docs for the API"
    elif status == 405:
        allow = _allowed_methods(request) or (exc.headers or {}).get("Allow", "")
        headers = {**(exc.headers or {}), "Allow": allow}
        detail = f"{request.method} is not allowed on this path; allowed: {allow}"
        return problem_response(status, code, detail, title=_phrase(status), headers=headers)
    else:
        detail = exc.detail if isinstance(exc.detail, str) else _phrase(status)
    return problem_response(status, code, detail, title=_phrase(status), headers=exc.headers)


async def _unexpected(request: Request, exc: Exception) -> Response:
    logger.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return problem_response(
        500,
        "internal_error",
        "the service failed to handle this request; the error was logged",
        title="Internal server error",
    )


def install_error_handlers(app: FastAPI) -> None:
    """Registers every handler: all 4xx/5xx answers become problem details."""
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(PlanError, _plan_error)
    app.add_exception_handler(MetricsError, _metrics_error)
    app.add_exception_handler(WorkerLost, _worker_lost)
    app.add_exception_handler(RuntimeTimeout, _runtime_timeout)
    app.add_exception_handler(RuntimeCommandError, _runtime_command_error)
    app.add_exception_handler(RequestValidationError, _request_validation)
    app.add_exception_handler(StarletteHTTPException, _http_exception)
    app.add_exception_handler(Exception, _unexpected)
