"""Limits on what one request may make the HTTP process hold: its head (request line and
header fields) and its answer.

Head. ``DATARAX_MAX_HEADER_KB`` (default 64 KiB, request line and every header field
together) and ``DATARAX_MAX_HEADERS`` (default 100 fields) cap a request's head; past
either the answer is 431 ``headers_too_large`` (RFC 6585 section 5) as problem JSON, with
``Connection: close``. The real server enforces them in its HTTP protocol
(:class:`app.api.middleware.ProblemHttpToolsProtocol`) while the head arrives, before the
parser has joined a large header value in memory: without it httptools (uvicorn's C
parser) holds a header of any size, joining the pieces of one value by repeated ``bytes``
concatenation, so a 32 MB value costs seconds of the event loop and its memory.
:class:`HeaderLimitMiddleware` checks the same limits on the ASGI scope, for the app run in
process (``TestClient``) or under another server.

The defaults follow common servers: Apache's ``LimitRequestFields`` is 100 fields
(httpd.apache.org/docs/2.4/mod/core.html#limitrequestfields); nginx's default
``large_client_header_buffers 4 8k`` holds up to 32 KiB of head and Node.js caps it at
16 KiB (``--max-http-header-size``). 64 KiB leaves room for long bearer tokens and cookies
set by other apps on the same host.

Answers. :class:`AnswerLimitMiddleware` refuses every answer whose identity body is above
``DATARAX_MAX_ANSWER_MB``, whatever the method (GET, POST, PUT, PATCH, DELETE) and status
(an error's body too), with 422 ``answer_too_large``. Routes that can predict a large answer
refuse it earlier, before building it (collect, full plan lists); this is the central
guarantee for every other one (a hardware plan's POST answer, a recommendation). An answer
that declares its length is checked at its start, before a byte of it is sent; a streamed
one (no ``Content-Length``) is held up to the limit and sent whole, or refused once it
passes. The dashboard's packaged assets are not answers built from a request and are not
limited.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.answer_limit import ANSWER_LIMIT, check_answer_size
from app.core.errors import PROBLEM_MEDIA_TYPE, AnswerTooLarge, ServiceError, problem_bytes

DEFAULT_MAX_HEADER_BYTES = 64 * 1024
DEFAULT_MAX_HEADERS = 100

HEAD_OVERHEAD = 4
"""Bytes a header field takes on the wire besides its name and value (``": "``, CRLF)."""


def head_too_large_detail(limit: int) -> str:
    return (
        f"the request line and headers pass the limit of {limit} bytes "
        "(DATARAX_MAX_HEADER_KB); send shorter header values"
    )


def too_many_headers_detail(limit: int) -> str:
    return (
        f"the request has more than {limit} header fields (DATARAX_MAX_HEADERS); "
        "send fewer, or join repeated ones into one comma-separated field"
    )


def headers_too_large(detail: str) -> ServiceError:
    """The 431 ``headers_too_large`` problem."""
    return ServiceError(detail, code="headers_too_large")


def head_bytes(scope: Scope) -> int:
    """The size of a request's head as it came on the wire, near enough: the path and
    query, and every header field (a plain loop: this runs for every request)."""
    headers = scope["headers"]
    size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") + 16
    size += HEAD_OVERHEAD * len(headers)
    for name, value in headers:
        size += len(name) + len(value)
    return size


async def send_problem(send: Send, error: ServiceError) -> None:
    """Answers ``error`` as problem JSON with ``Connection: close``."""
    body = problem_bytes(error.status, error.code, error.detail, title=error.title)
    headers = [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send(
        {
            "type": "http.response.start",
            "status": error.status,
            "headers": [
                (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class HeaderLimitMiddleware:
    """431 ``headers_too_large`` for a request whose head passes ``max_bytes`` or has more
    than ``max_headers`` fields (the ASGI-level check; see the module docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int = DEFAULT_MAX_HEADER_BYTES,
        max_headers: int = DEFAULT_MAX_HEADERS,
    ):
        self.app = app
        self.max_bytes = max_bytes
        self.max_headers = max_headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = scope["headers"]
            if len(headers) > self.max_headers:
                await send_problem(
                    send, headers_too_large(too_many_headers_detail(self.max_headers))
                )
                return
            if head_bytes(scope) > self.max_bytes:
                await send_problem(send, headers_too_large(head_too_large_detail(self.max_bytes)))
                return
        await self.app(scope, receive, send)


UNLIMITED_PREFIXES = ("/dashboard/",)
"""Paths whose answers are packaged files, not built from requests (see module docstring)."""


class AnswerLimitMiddleware:
    """422 ``answer_too_large`` instead of any answer above ``max_bytes`` (identity body:
    install it inside compression)."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    def _refusal(self, size: int) -> AnswerTooLarge:
        try:
            check_answer_size(size)
        except AnswerTooLarge as refusal:
            return refusal
        raise AssertionError("only called for sizes above the limit")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or str(scope.get("path", "")).startswith(UNLIMITED_PREFIXES):
            await self.app(scope, receive, send)
            return
        token = ANSWER_LIMIT.set(self.max_bytes)
        try:
            await self._limited(scope, receive, send)
        finally:
            ANSWER_LIMIT.reset(token)

    async def _limited(self, scope: Scope, receive: Receive, send: Send) -> None:
        passing = False  # the start was judged and sent: the rest goes straight through
        refused = False
        held: Message | None = None  # a streamed answer's start, while its body is held
        chunks: list[bytes] = []
        total = 0

        async def limited(message: Message) -> None:
            nonlocal passing, refused, held, total
            if passing:
                await send(message)
                return
            if refused:
                return  # the rest of a refused body
            kind = message["type"]
            if kind == "http.response.start":
                length = _content_length(message)
                if length is None:
                    held = message
                elif length > self.max_bytes:
                    refused = True
                    await send_problem(send, self._refusal(length))
                else:
                    passing = True
                    await send(message)
                return
            if held is None or kind != "http.response.body":
                await send(message)  # not an answer we hold: not ours to judge
                return
            body = message.get("body", b"")
            total += len(body)
            if total > self.max_bytes:
                refused, chunks[:] = True, []
                await send_problem(send, self._refusal(total))
                return
            chunks.append(body)
            if message.get("more_body", False):
                return
            passing = True
            await send(held)
            await send({"type": "http.response.body", "body": b"".join(chunks)})

        await self.app(scope, receive, limited)


def _content_length(start: Message) -> int | None:
    for name, value in start.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
