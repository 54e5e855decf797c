"""The request id: taken from ``X-Request-ID`` or generated, echoed, and logged.

:class:`RequestIdMiddleware` is pure ASGI (the metric routes are speed-sensitive: one
header scan, one contextvar set, one header appended). A client's ``X-Request-ID`` is kept
when it is 1 to :data:`MAX_REQUEST_ID` characters of ``A-Z a-z 0-9 . _ : -`` (UUIDs,
ULIDs, trace ids); anything else (too long, spaces, control characters that could forge
log lines) is replaced by a fresh id. The id in use is answered in ``X-Request-ID`` (no
route sets that header itself), set in :data:`app.core.logs.REQUEST_ID` for every log line of
the request, and sent to the runtime with each command
(:meth:`app.workers.runtime_client.RuntimeClient.call`).
"""

from __future__ import annotations

import itertools
import os
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.logs import REQUEST_ID

HEADER = b"x-request-id"
MAX_REQUEST_ID = 128
_VALID = re.compile(rb"[A-Za-z0-9._:\-]{1,%d}" % MAX_REQUEST_ID)


_PREFIX = os.urandom(8).hex()
_COUNTER = itertools.count(1)


def new_request_id() -> str:
    """A fresh id, 32 hex digits: 64 random bits drawn once per process, then a counter
    (unique across processes and restarts without a syscall per request)."""
    return f"{_PREFIX}{next(_COUNTER):016x}"


def request_id_of(value: bytes | None) -> str:
    """The id to use for a request whose ``X-Request-ID`` is ``value`` (``None``: absent)."""
    if value is not None and _VALID.fullmatch(value):
        return value.decode("ascii")
    return new_request_id()


class RequestIdMiddleware:
    """Pure ASGI middleware: sets the request id for the request and answers it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = None
        for name, value in scope["headers"]:
            if name == HEADER:
                given = value
                break
        request_id = request_id_of(given)
        answer_header = (HEADER, request_id.encode("ascii"))

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                # A new list: the response object's own header list stays untouched.
                message["headers"] = [*message.get("headers", ()), answer_header]
            await send(message)

        token = REQUEST_ID.set(request_id)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(token)
