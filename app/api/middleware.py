"""What stands between a request and the routes: the guards, and the error handlers that
turn every error into RFC 9457 problem details.

Request path, outermost first::

    ServerErrorMiddleware  (Starlette; unexpected exceptions -> 500 internal_error)
    ShutdownMiddleware     (503 shutting_down for requests the grace period cut short)
    RequestMetricsMiddleware  (Prometheus: counts every answer, 401/413 included)
    HeadAsGetMiddleware    (HEAD runs the GET route and drops the body)
    HeaderLimitMiddleware  (431 headers_too_large; app.api.http_limits)
    BearerAuthMiddleware   (401 before anything reads the body)
    BodyLimitMiddleware    (413 before the body is read)
    HttpCacheMiddleware    (ETags, 304s, gzip; app.api.http_cache)
    AnswerLimitMiddleware  (422 answer_too_large for any answer past the limit)
    ExceptionMiddleware -> router -> routes

Before all of them, the HTTP protocol (:class:`ProblemHttpToolsProtocol`) refuses a
request head past the header limits with 431 while it arrives.

Every 4xx/5xx answer is ``application/problem+json`` built from :mod:`app.core.errors`: a
:class:`~app.core.errors.ServiceError` as it says, the library's ``PlanError``/``MetricsError``
through ``from_library``, FastAPI's validation errors as ``validation_error`` naming each
field (``loc``, ``field``), and Starlette's own 404/405 with their codes.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.api.http_limits import (
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_HEADERS,
    head_too_large_detail,
    send_problem,
    too_many_headers_detail,
)
from app.core.errors import (
    PROBLEM_MEDIA_TYPE,
    BadRequest,
    InvalidJson,
    PayloadTooLarge,
    ServiceError,
    ShuttingDown,
    Unauthorized,
    code_for_status,
    from_library,
    problem_bytes,
    validation_error,
)
from datarax.errors import MetricsError, PlanError

log = logging.getLogger("datarax.app")


_send_problem = send_problem  # answers from a pure ASGI middleware, Connection: close


class BodyLimitMiddleware:
    """413 ``payload_too_large`` for bodies above ``max_bytes``, without reading them.

    A declared ``Content-Length`` above the limit is refused before a byte of the body is
    read. A body without one (chunked) is read up to the limit and refused as soon as it
    crosses it; under the limit it is replayed to the app. Reads are also counted for
    declared lengths, as a second line of defence.
    """

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self, size: str) -> str:
        return (
            f"request body of {size} exceeds the limit of {self.max_bytes} bytes "
            "(DATARAX_MAX_BODY_MB); send less, or npz-compress large arrays"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                await _send_problem(send, BadRequest("Content-Length is not a number"))
                return
            if length > self.max_bytes:
                await _send_problem(send, PayloadTooLarge(self._too_large(f"{length}")))
                return
            await self.app(scope, self._counting(receive), send)
            return
        if b"chunked" not in headers.get(b"transfer-encoding", b"").lower():
            await self.app(scope, receive, send)  # no body
            return
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # disconnect: let the app see it
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                await _send_problem(
                    send, PayloadTooLarge(self._too_large(f"more than {total} bytes"))
                )
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _counting(self, receive: Receive) -> Receive:
        total = 0

        async def counted() -> Message:
            nonlocal total
            message = await receive()
            if message["type"] == "http.request":
                total += len(message.get("body", b""))
                if total > self.max_bytes:
                    # Only reachable if the server let more than Content-Length through.
                    raise RuntimeError("request body exceeded its declared Content-Length")
            return message

        return counted


class BearerAuthMiddleware:
    """401 ``unauthorized`` for mutating requests without the bearer token, and, with
    ``reads`` (``DATARAX_AUTH_READS``), for reads under ``/v1/`` too.

    Runs before the body is read; the scheme is case-insensitive (RFC 9110 section 11.1:
    ``bearer``, ``BEARER``), the token compared in constant time (``hmac.compare_digest``).
    """

    MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})

    def __init__(self, app: ASGIApp, token: str, reads: bool = False):
        self.app = app
        self.expected = token.encode()
        self.reads = reads

    def _guarded(self, scope: Scope) -> bool:
        if scope.get("method") in self.MUTATING:
            return True
        return self.reads and str(scope.get("path", "")).startswith("/v1/")

    def _valid(self, given: bytes) -> bool:
        scheme, _, credentials = given.strip().partition(b" ")
        # compare_digest on every path, so a wrong scheme costs the same as a wrong token
        matches = hmac.compare_digest(credentials.strip(), self.expected)
        return scheme.lower() == b"bearer" and matches

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self._guarded(scope):
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not self._valid(given):
                detail = (
                    "this request needs Authorization: Bearer <token> (DATARAX_API_TOKEN)"
                    if not given
                    else "the bearer token is not valid"
                )
                await _send_problem(send, Unauthorized(detail))
                return
        await self.app(scope, receive, send)


class HeadAsGetMiddleware:
    """HEAD on any GET route (RFC 9110 section 9.3.2): runs the GET and sends its status
    and headers (``Content-Length`` included) without the body."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)


class ShutdownMiddleware:
    """Answers 503 ``shutting_down`` to a request that the shutdown grace period cut short.

    On SIGTERM uvicorn stops accepting connections, lets requests in flight run for
    ``DATARAX_SHUTDOWN_GRACE_S`` and then cancels them; a cancelled request whose answer
    had not started gets this problem (with ``Connection: close``) instead of a 500 or a
    reset. A cancellation for any other reason (the client went away) is passed on.
    """

    def __init__(self, app: ASGIApp, lifecycle: Any):
        self.app = app
        self.lifecycle = lifecycle  # app.main.Lifecycle: .shutting_down

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self.lifecycle.shutting_down or started:
                raise
            if task is not None:
                task.uncancel()
            await _send_problem(
                send,
                ShuttingDown(
                    "the service is shutting down and this request did not finish within "
                    "the grace period (DATARAX_SHUTDOWN_GRACE_S); retry against a running "
                    "instance"
                ),
            )


class _HeadRefused(Exception):
    """Raised in a parser callback to stop parsing a head past the limits."""


STATUS_LINE_431 = b"HTTP/1.1 431 Request Header Fields Too Large\r\n"

DRAIN_BYTES = 64 * 1024 * 1024
DRAIN_S = 10.0
"""After a 431 the rest of the client's head is read and dropped, up to this much or this
long, then the connection closes: closing at once, with the client still sending, makes
the kernel reset the connection, and most clients then never read the 431."""


class ProblemHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with two changes.

    - Its own 400 (a request line or header it cannot parse, e.g. ``Content-Length: abc``)
      is problem JSON like every other error.
    - A request head (request line and header fields) above :attr:`max_head_bytes`, or with
      more than :attr:`max_headers` fields, is answered 431 ``headers_too_large`` (problem
      JSON, ``Connection: close``) and never handed to the app. Bytes are counted in
      ``data_received`` *before* the parser sees them (httptools joins the pieces of a
      header value itself and calls back only with the whole value), so the process holds
      at most the limit plus one read of a head, whatever the client sends. The count ends
      at the head's blank line (``CRLF CRLF``, or ``LF LF``, which llhttp also accepts); a
      read that carries the end of one pipelined request and the start of the next is
      counted for the first, so the next head may pass the limit by one read (at most
      256 KiB with uvloop).

    :meth:`with_limits` makes the class ``app.cli`` hands to uvicorn, with the settings'
    limits.
    """

    max_head_bytes: int = DEFAULT_MAX_HEADER_BYTES
    max_headers: int = DEFAULT_MAX_HEADERS

    @classmethod
    def with_limits(cls, max_head_bytes: int, max_headers: int) -> type[ProblemHttpToolsProtocol]:
        """This protocol with the given head limits (``DATARAX_MAX_HEADER_KB``,
        ``DATARAX_MAX_HEADERS``)."""
        return type(
            cls.__name__, (cls,), {"max_head_bytes": max_head_bytes, "max_headers": max_headers}
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # the next bytes belong to a request head
        self._head_seen = 0  # bytes of the current head so far
        self._head_tail = b""  # its last 3 bytes: a blank line may straddle two reads
        self._header_count = 0
        self._refusal: str | None = None
        self._draining = 0  # bytes still to drop after a 431; 0: not draining

    def data_received(self, data: bytes) -> None:
        if self._draining:
            self._draining = max(0, self._draining - len(data))
            if not self._draining:
                self.transport.close()
            return
        if self._in_head and self._head_overflows(data):
            self._refuse_head(head_too_large_detail(self.max_head_bytes))
            return
        super().data_received(data)

    def _head_overflows(self, data: bytes) -> bool:
        """True when the current head passes ``max_head_bytes`` with ``data``."""
        room = self.max_head_bytes - self._head_seen
        window = self._head_tail + data[: room + 4]
        if b"\r\n\r\n" in window or b"\n\n" in window:
            return False  # the head ends within the limit, in this read
        if len(data) > room:
            return True
        self._head_seen += len(data)
        self._head_tail = window[-3:]
        return False

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_count = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.max_headers:
            self._refusal = too_many_headers_detail(self.max_headers)
            raise _HeadRefused  # parsing stops; send_400_response answers 431
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._head_seen, self._head_tail = True, 0, b""

    def _refuse_head(self, detail: str) -> None:
        body = problem_bytes(431, "headers_too_large", detail)
        self._write_problem(STATUS_LINE_431, body)
        # Read and drop what the client is still sending, then close (see DRAIN_BYTES).
        self._draining = DRAIN_BYTES
        transport = self.transport
        asyncio.get_running_loop().call_later(DRAIN_S, transport.close)

    def send_400_response(self, msg: str) -> None:
        if self._refusal is not None:
            self._refuse_head(self._refusal)
            return
        body = problem_bytes(400, "bad_request", f"{msg} (malformed request line or headers)")
        self._write_problem(b"HTTP/1.1 400 Bad Request\r\n", body)
        self.transport.close()

    def _write_problem(self, status_line: bytes, body: bytes, extra: bytes = b"") -> None:
        self.transport.write(
            b"".join(
                [
                    status_line,
                    *(name + b": " + value + b"\r\n" for name, value in self._default_headers()),
                    extra,
                    b"content-type: " + PROBLEM_MEDIA_TYPE.encode() + b"\r\n",
                    b"content-length: " + str(len(body)).encode() + b"\r\n",
                    b"connection: close\r\n\r\n",
                    body,
                ]
            )
        )

    def _default_headers(self) -> list[tuple[bytes, bytes]]:
        return list(self.server_state.default_headers)


# ----------------------------------------------------------------------------- handlers


def problem_response(error: ServiceError) -> Response:
    """The ``application/problem+json`` answer of ``error``."""
    return Response(
        problem_bytes(error.status, error.code, error.detail, title=error.title, **error.extra),
        status_code=error.status,
        media_type=PROBLEM_MEDIA_TYPE,
        headers=error.headers or None,
    )


async def _service_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServiceError)
    return problem_response(exc)


async def _library_error(_request: Request, exc: Exception) -> Response:
    return problem_response(from_library(exc))


def field_vocabulary(app: Any) -> frozenset[str]:
    """Every property name of the request and answer schemas in the app's OpenAPI
    document (built once, then kept on ``app.state``): what a mistyped field is matched
    against."""
    names = getattr(app.state, "field_vocabulary", None)
    if names is None:
        schemas = app.openapi().get("components", {}).get("schemas", {})
        names = frozenset(
            name for schema in schemas.values() for name in schema.get("properties", {})
        )
        app.state.field_vocabulary = names
    return frozenset(names)


async def _request_validation(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return problem_response(validation_error(exc.errors(), field_vocabulary(request.app)))


_FASTAPI_BODY_PARSE_ERROR = "There was an error parsing the body"


def _allowed_methods(request: Request) -> str:
    """Every method some route serves on this path (Starlette names only the first route)."""
    allowed = []
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
        probe = {**request.scope, "method": method}
        if any(route.matches(probe)[0] == Match.FULL for route in request.app.router.routes):
            allowed.append(method)
            if method == "GET":
                allowed.append("HEAD")  # HeadAsGetMiddleware
    return ", ".join(allowed)


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    if status == 400 and exc.detail == _FASTAPI_BODY_PARSE_ERROR:
        if isinstance(exc.__cause__, ClientDisconnect):
            # FastAPI's body models read the body themselves and wrap the hang-up.
            return await _client_gone(request, exc.__cause__)
        if isinstance(exc.__cause__, ServiceError):  # the service's parser refused it
            return problem_response(exc.__cause__)
        # FastAPI's answer to a JSON body it cannot decode (e.g. not UTF-8): the same
        # problem as any other malformed JSON.
        return problem_response(
            InvalidJson("request body is not valid JSON (it could not be decoded); send UTF-8 JSON")
        )
    code = code_for_status(status)
    headers = dict(exc.headers or {})
    if status == 404:
        detail = "no such path; see /docs for the API"
    elif status == 405:
        headers["Allow"] = _allowed_methods(request) or headers.get("Allow", "")
        detail = f"{request.method} is not allowed on this path; allowed: {headers['Allow']}"
    else:
        detail = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
    return problem_response(ServiceError(detail, code=code, headers=headers))


class _LineLimit:
    """At most ``lines`` log lines per ``window_s``; the lines held back are counted and
    said in the next line let through, so a client cannot grow the log without bound."""

    def __init__(self, lines: int = 10, window_s: float = 10.0) -> None:
        self.lines, self.window_s = lines, window_s
        self._start = 0.0
        self._sent = 0
        self.held = 0

    def allow(self, now: float) -> bool:
        if now - self._start >= self.window_s:
            self._start, self._sent = now, 0
        if self._sent < self.lines:
            self._sent += 1
            return True
        self.held += 1
        return False


_HANG_UPS = _LineLimit()

TIMEOUT_KEY = "datarax.timed_out"
"""Scope key the connection's body timeout sets before it closes the connection
(:mod:`app.api.connections`): the request then ends as 408 ``request_timeout``, not 499."""


async def _client_gone(request: Request, _exc: Exception) -> Response:
    """A client that hangs up before its body has arrived: 499 ``request_abandoned`` (no
    one reads it; the access log and ``/metrics`` count it) and one log line, never a
    traceback; at most 10 such lines per 10 s, the rest counted in the next. One whose
    connection the body timeout closed is 408 ``request_timeout`` instead."""
    waited = request.scope.get(TIMEOUT_KEY)
    if waited is not None:
        if _HANG_UPS.allow(asyncio.get_running_loop().time()):
            held, _HANG_UPS.held = _HANG_UPS.held, 0
            more = f" ({held} more such lines held back)" if held else ""
            log.info("closed %s %s: no body bytes for %g s (DATARAX_BODY_TIMEOUT_S)%s",
                     request.method, request.url.path, waited, more)  # fmt: skip
        return problem_response(
            ServiceError(
                f"no body bytes arrived for {waited:g} s (DATARAX_BODY_TIMEOUT_S)",
                code="request_timeout",
            )
        )
    if _HANG_UPS.allow(asyncio.get_running_loop().time()):
        held, _HANG_UPS.held = _HANG_UPS.held, 0
        more = f" ({held} more hang-ups since the last such line)" if held else ""
        log.info("client hung up during %s %s before its body arrived%s",
                 request.method, request.url.path, more)  # fmt: skip
    return problem_response(
        ServiceError(
            "the client closed the connection before its body arrived", code="request_abandoned"
        )  # fmt: skip
    )


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return problem_response(
        ServiceError("the service failed to handle this request; the error was logged")
    )


def install_error_handlers(app: FastAPI) -> None:
    """Registers every handler: all 4xx/5xx answers become problem details."""
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(PlanError, _library_error)
    app.add_exception_handler(MetricsError, _library_error)
    app.add_exception_handler(RequestValidationError, _request_validation)
    app.add_exception_handler(StarletteHTTPException, _http_exception)
    app.add_exception_handler(ClientDisconnect, _client_gone)
    app.add_exception_handler(Exception, _unexpected)
