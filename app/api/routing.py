"""``RequestOnlyRoute``: a FastAPI route for endpoints that take the Request and nothing else.

FastAPI runs every route through its request handler: two ``AsyncExitStack`` s per
request, dependency solving, parameter and body parsing, response-model handling. For
an endpoint whose one parameter is the ``Request`` and that returns a ``Response``, all
of that does nothing, yet it cost about 40 us a request under socket load on the
benchmark machine: more than twice the work of a small metrics reduction (see
BENCHMARKS.md). This route class keeps everything FastAPI derives from the route (path
matching, the OpenAPI operation with its ``openapi_extra``, ``responses`` and tags) and
calls the endpoint directly.

Exceptions the endpoint raises propagate to Starlette's ``ExceptionMiddleware``, which
looks them up in the same handler table FastAPI's per-route wrapper uses, so every error
answer (RFC 9457 problems with their codes) is the same as on other routes.

``read_body`` and ``BytesResponse`` are the matching thin ends of such an endpoint: the
body straight from the ASGI ``receive`` and pre-encoded bytes straight to ``send``.

Only endpoints of the form ``async def endpoint(request: Request) -> Response`` are
accepted, without ``dependencies`` or ``status_code``; anything else is refused when the
route is built, so nothing declared can be silently ignored.
"""

from __future__ import annotations

import email.message
import functools
import inspect
import json
import typing
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import orjson
from fastapi.dependencies.utils import request_params_to_args
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.api.http_cache import negotiated_part
from app.codecs.json_arrays import TooManyJsonValues, loads_json
from app.codecs.media import JSON_MEDIA_TYPE, NPZ_MEDIA_TYPE, is_json_media
from app.core.errors import InvalidJson, UnsupportedMediaType
from app.core.threads import run_for_body
from datarax.answers.base import Answer


def _check_request_only(endpoint: Callable[..., Any]) -> None:
    if not inspect.iscoroutinefunction(endpoint):
        raise TypeError(f"{endpoint.__qualname__}: a RequestOnlyRoute endpoint must be async")
    params = list(inspect.signature(endpoint).parameters)
    hints = typing.get_type_hints(endpoint)
    if len(params) != 1 or hints.get(params[0]) is not Request:
        raise TypeError(
            f"{endpoint.__qualname__}: a RequestOnlyRoute endpoint takes exactly one "
            "parameter, annotated Request"
        )


class RequestOnlyRoute(APIRoute):
    """An ``APIRoute`` that calls ``endpoint(request)`` and sends the Response it returns."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        _check_request_only(endpoint)
        if kwargs.get("status_code") is not None:
            raise TypeError(f"{path}: a RequestOnlyRoute's status is its Response's own")
        super().__init__(path, endpoint, **kwargs)
        if self.dependant.dependencies:
            raise TypeError(f"{path}: a RequestOnlyRoute runs no dependencies")
        call: Callable[[Request], Awaitable[Response]] = endpoint

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            response = await call(Request(scope, receive, send))
            await response(scope, receive, send)

        self.app = app


DOC_ONLY = "__datarax_doc_only__"
"""Attribute set (True) on a dependency that only documents the operation (the bearer
scheme): :class:`ParamsRoute` leaves it out of the request."""


class ParamsRoute(APIRoute):
    """An ``APIRoute`` for endpoints that take the ``Request`` plus path and query
    parameters, and return a ``Response``.

    FastAPI's own ``request_params_to_args`` validates the parameters (the same values
    and the same ``RequestValidationError`` as any route, and the OpenAPI operation is
    FastAPI's, from the signature); the rest of its request handler (two exit stacks,
    dependency solving, response handling: about a sixth of the server's GIL time for a
    small job push under 64 concurrent pushers, py-spy, 2026-12-01) is skipped. Services
    come from ``request.app.state``. Refused when the route is built: body, header or
    cookie parameters, and dependencies other than documentation-only ones (``DOC_ONLY``).
    The status sent is the Response's own; ``status_code`` only documents it.
    """

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        if not inspect.iscoroutinefunction(endpoint):
            raise TypeError(f"{endpoint.__qualname__}: a ParamsRoute endpoint must be async")
        super().__init__(path, endpoint, **kwargs)
        dependant = self.dependant
        for dependency in dependant.dependencies:
            if not getattr(dependency.call, DOC_ONLY, False):
                raise TypeError(f"{path}: a ParamsRoute runs no dependencies")
        if dependant.body_params or dependant.header_params or dependant.cookie_params:
            raise TypeError(f"{path}: a ParamsRoute takes path and query parameters only")
        request_name = dependant.request_param_name
        if request_name is None:
            raise TypeError(f"{endpoint.__qualname__}: a ParamsRoute endpoint takes the Request")
        path_fields, query_fields = dependant.path_params, dependant.query_params
        call: Callable[..., Awaitable[Response]] = endpoint

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            request = Request(scope, receive, send)
            values, errors = request_params_to_args(path_fields, request.path_params)
            if query_fields:
                query, more = request_params_to_args(query_fields, request.query_params)
                values.update(query)
                errors.extend(more)
            if errors:
                raise RequestValidationError(errors)
            values[request_name] = request
            response = await call(**values)
            await response(scope, receive, send)

        self.app = app


class _ServiceJsonRequest(Request):
    """A Request whose ``json()`` is the service's parser: :func:`loads_json` (orjson, its
    20-digit integer bound and nesting limit), in a worker thread above 64 KiB."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = await run_for_body(lambda: loads_json(body), len(body))
            except TooManyJsonValues as err:
                raise InvalidJson(str(err)) from None
        return self._json


class JsonBodyRoute(APIRoute):
    """An ``APIRoute`` whose body model is read from JSON parsed by :func:`loads_json`.

    FastAPI reads a body model's JSON with Starlette's ``Request.json()``: the standard
    library's ``json.loads`` on the event loop, with no bound on integer digits. A 64 MiB
    body then held the loop for seconds (``/health/live`` too: 1.4 s for 15,000 integers
    of 4,299 digits, 21 s for deep nesting; issue 41). Routes without a body model are
    left as ``APIRoute`` builds them. The parse still holds the GIL while orjson runs, so
    a huge body still delays the loop (issue 41); it no longer runs on it.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def with_service_json(request: Request) -> Response:
            return await handler(_ServiceJsonRequest(request.scope, request.receive))

        return with_service_json


async def read_body(request: Request) -> bytes:
    """The whole request body, read once from the ASGI ``receive``.

    Starlette's ``Request.body()`` goes through an async generator and a cache; a body
    that arrives in one message (every small one) is returned as is here, larger ones
    are joined once. Raises ``ClientDisconnect`` like Starlette when the client goes.
    Only for endpoints that read the body nowhere else.
    """
    receive = request.receive
    message = await receive()
    if message["type"] != "http.request":
        raise ClientDisconnect()
    if not message.get("more_body", False):
        return message.get("body", b"")
    chunks = [message.get("body", b"")]
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientDisconnect()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


class BytesResponse(Response):
    """A 200 (or ``status``) answer of bytes already encoded, with the two headers it needs.

    ``Response.__init__`` renders its content and derives headers generically; here the
    body is ready and the headers are known, so they are set directly.
    """

    def __init__(
        self,
        content: bytes,
        media_type: str,
        status_code: int = 200,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        self.status_code = status_code
        self.media_type = media_type
        self.background = None
        self.body = content
        self.raw_headers = [
            (b"content-length", str(len(content)).encode("latin-1")),
            (b"content-type", media_type.encode("latin-1")),
            *headers,
        ]


def json_response(
    content: bytes | str, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    """An ``application/json`` answer of already-encoded JSON."""
    return Response(content, status_code=status, media_type=JSON_MEDIA_TYPE, headers=headers)


def answer_response(
    answer: Answer, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    """An ``application/json`` answer of one answer type (:mod:`datarax.answers`), as its
    :meth:`~datarax.answers.base.Answer.to_json` gives it."""
    content = orjson.dumps(answer.to_json())
    extra = tuple(
        (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()
    )
    return BytesResponse(content, JSON_MEDIA_TYPE, status, extra)


def json_text(value: object) -> str:
    """Compact, strict JSON text of ``value`` (no NaN or Infinity)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


# ------------------------------------------------------------------- media types


MAX_CACHED_HEADER = 256
"""``Content-Type`` and ``Accept`` values up to this length have their parse cached (256
of each at most: 64 KiB of keys); longer ones are parsed each time and never kept, so no
cache grows with what a client sends (the parse of an ``Accept`` reads its first KiB, of a
``Content-Type`` its media type; both linear)."""


def media_type(request: Request) -> str | None:
    """The request's media type, lower-case, without parameters; None when absent."""
    # Read from the raw ASGI headers: building request.headers costs more than this.
    for name, value in request.scope["headers"]:
        if name == b"content-type":
            if not value:
                return None
            text = value.decode("latin-1")
            if len(text) <= MAX_CACHED_HEADER:
                return _parse_media_type_cached(text)
            return _parse_media_type(text)
    return None


def _parse_media_type(value: str) -> str:
    message = email.message.Message()
    message["content-type"] = value
    return message.get_content_type().lower()


# Clients send a handful of distinct short Content-Type values; parsing one costs ~10 us.
_parse_media_type_cached = functools.lru_cache(maxsize=256)(_parse_media_type)


def accepts_npz(request: Request) -> bool:
    """True when the client prefers an ``application/x-npz`` answer to JSON.

    That is: its Accept header gives ``application/x-npz`` a q above 0 and above the q
    of an explicit ``application/json``. Wildcards (``*/*``, ``application/*``) and a
    missing header keep the JSON default, and a tie goes to JSON.
    """
    values = [value for name, value in request.scope["headers"] if name == b"accept"]
    if not values:
        return False
    # Repeated Accept headers are one comma-separated list (RFC 9110 section 5.3).
    joined = b",".join(values)
    if len(joined) <= MAX_CACHED_HEADER:
        return _prefers_npz_cached(joined.decode("latin-1"))
    # Past a KiB only the leading whole items count (see app.api.http_cache.MAX_NEGOTIATED).
    return _prefers_npz(negotiated_part(joined).decode("latin-1"))


def _prefers_npz(accept: str) -> bool:
    npz_q = json_q = 0.0
    for item in accept.split(","):
        if not item or item.isspace():
            continue  # an empty list item
        media, *params = (part.strip() for part in item.split(";"))
        q = 1.0
        for param in params:
            key, _, raw = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(raw)
                except ValueError:
                    q = 0.0
        media = media.lower()
        if media == NPZ_MEDIA_TYPE:
            npz_q = max(npz_q, q)
        elif media == JSON_MEDIA_TYPE:
            json_q = max(json_q, q)
    return npz_q > 0 and npz_q > json_q


_prefers_npz_cached = functools.lru_cache(maxsize=256)(_prefers_npz)


def require_json(request: Request) -> None:
    """415 ``unsupported_media_type`` unless the body is declared JSON.

    Runs before body validation, so a form or text body is a 415, not a 422.
    """
    media = media_type(request)
    if not is_json_media(media):
        raise UnsupportedMediaType(
            f"Content-Type {_shown(request.headers.get('content-type'))} is not accepted "
            f"here; send {JSON_MEDIA_TYPE}"
        )


def _shown(value: str | None, limit: int = 100) -> str:
    """``value`` as a detail shows it: its repr, cut to ``limit`` characters."""
    return repr(value) if value is None or len(value) <= limit else repr(value[:limit]) + "..."
