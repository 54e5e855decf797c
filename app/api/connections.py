"""Bounds on what a connection may hold: time without progress, and how many connections.

A client that opens connections and then sends nothing, half a head or half a body, or
asks for an answer and never reads it, holds a socket (one file descriptor) and, for an
unread answer, the answer's bytes. Without bounds, about a thousand idle sockets exhaust
a 1,024 file-descriptor limit, after which every request, health checks too, is reset.
:class:`GuardedHttpToolsProtocol` (the protocol ``datarax-serve`` hands to uvicorn) adds:

- **Head timeout** (``DATARAX_HEADER_TIMEOUT_S``): a new connection sends a whole request
  head (request line and header fields) within this time, and so does a kept-alive one
  from the first byte of its next head. Past it: 408 ``request_timeout`` when part of a
  head arrived, a plain close when nothing did. Idle kept-alive connections between
  requests close after ``DATARAX_KEEP_ALIVE_S`` (uvicorn's timer).
- **Body timeout** (``DATARAX_BODY_TIMEOUT_S``): the longest pause between two reads of a
  request body (as nginx's ``client_body_timeout``: a slow body that keeps arriving is
  fine). Past it the connection closes and the request ends as 408 ``request_timeout``
  (access log and ``/metrics``; one rate-limited log line).
- **Write timeout** (``DATARAX_WRITE_TIMEOUT_S``): the longest an answer may sit in a full
  send buffer without the client reading (as nginx's ``send_timeout``). Past it the
  connection is dropped and the answer's bytes are freed. A client reading slower than
  the send buffer's 48 KiB (high minus low water mark) per timeout counts as not reading.
- **Connection bound** (``DATARAX_MAX_CONNECTIONS``, by default the process's
  file-descriptor limit less :data:`FD_RESERVE` and :data:`HEALTH_ROOM`): a connection
  past it first closes the connection that has waited longest without a request in
  progress (idle, or still sending its head); when every connection has a request in
  progress, the new one may still serve health checks (``/health/...``) up to
  :data:`HEALTH_ROOM` more connections and is answered 503 ``too_many_connections`` for
  anything else; past that it is closed at once. The process never runs out of file
  descriptors, so the listening socket keeps accepting.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any, ClassVar, cast

from app.api.middleware import (
    TIMEOUT_KEY,
    ProblemHttpToolsProtocol,
    _HeadRefused,
    _LineLimit,
)
from app.core.errors import problem_bytes

log = logging.getLogger("datarax.app")

FD_RESERVE = 128
"""File descriptors kept out of the connection bound: the database and its WAL, the
runtime's pipes and sockets, log files, the listening socket, JAX's distributed runtime."""

HEALTH_ROOM = 32
"""Connections past ``DATARAX_MAX_CONNECTIONS`` kept for health checks while every
connection within the bound has a request in progress."""

MAX_FILE_DESCRIPTORS = 1 << 20

STATUS_LINE_408 = b"HTTP/1.1 408 Request Timeout\r\n"
STATUS_LINE_503 = b"HTTP/1.1 503 Service Unavailable\r\n"

_CLOSES = _LineLimit()


def raise_fd_limit() -> int:
    """Raises this process's soft file-descriptor limit to its hard limit (as Go's runtime
    does at start; capped at 2**20) and returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap = MAX_FILE_DESCRIPTORS
    if hard != resource.RLIM_INFINITY:
        cap = min(hard, cap)
    if soft == resource.RLIM_INFINITY:
        return cap
    if soft < cap:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (cap, hard))
            soft = cap
        except (ValueError, OSError):
            pass
    return min(soft, MAX_FILE_DESCRIPTORS)


def default_max_connections(fd_limit: int) -> int:
    """The connection bound a file-descriptor limit leaves room for (at least 1)."""
    return max(1, fd_limit - FD_RESERVE - HEALTH_ROOM)


def _is_health(path: bytes) -> bool:
    return path == b"/health" or path.startswith(b"/health/")


def _log_close(what: str) -> None:
    if _CLOSES.allow(asyncio.get_running_loop().time()):
        held, _CLOSES.held = _CLOSES.held, 0
        more = f" ({held} more such closes since the last line)" if held else ""
        log.info("%s%s", what, more)


class GuardedHttpToolsProtocol(ProblemHttpToolsProtocol):
    """:class:`ProblemHttpToolsProtocol` with the timeouts and the connection bound of the
    module docstring. :meth:`configured` makes the class ``app.cli`` hands to uvicorn."""

    header_timeout_s: ClassVar[float] = 20.0
    body_timeout_s: ClassVar[float] = 60.0
    write_timeout_s: ClassVar[float] = 60.0
    max_connections: ClassVar[int] = 1024

    @classmethod
    def configured(
        cls,
        *,
        max_head_bytes: int,
        max_headers: int,
        header_timeout_s: float,
        body_timeout_s: float,
        write_timeout_s: float,
        max_connections: int,
    ) -> type[GuardedHttpToolsProtocol]:
        """This protocol with the given limits (the settings of the same names)."""
        return type(
            cls.__name__,
            (cls,),
            {
                "max_head_bytes": max_head_bytes,
                "max_headers": max_headers,
                "header_timeout_s": header_timeout_s,
                "body_timeout_s": body_timeout_s,
                "write_timeout_s": write_timeout_s,
                "max_connections": max_connections,
            },
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_kind = ""
        self._waiting_since = 0.0  # when it last had no request in progress
        self._over_bound = False  # past max_connections: health checks only
        self._answer_instead: tuple[bytes, int, str, str] | None = None

    # ------------------------------------------------------------------------ timers

    def _arm(self, kind: str, seconds: float) -> None:
        self._disarm()
        self._timer_kind = kind
        self._timer = self.loop.call_later(seconds, self._expired, kind)

    def _disarm(self, kind: str | None = None) -> None:
        if self._timer is not None and (kind is None or self._timer_kind == kind):
            self._timer.cancel()
            self._timer, self._timer_kind = None, ""

    def _expired(self, kind: str) -> None:
        self._timer, self._timer_kind = None, ""
        if kind == "write":
            # Even a closing transport: close() waits for the unsent bytes (a kept-alive
            # connection's idle timer closes it right after the answer is handed over).
            _log_close(
                f"closed a connection that read none of its answer for {self.write_timeout_s:g} s "
                "(DATARAX_WRITE_TIMEOUT_S)"
            )
            self.transport.abort()  # drop the unsent bytes
            return
        if self.transport.is_closing():
            return
        if kind == "head":
            if self._head_seen or self._head_tail:
                detail = (
                    f"the request head did not arrive within {self.header_timeout_s:g} s "
                    "(DATARAX_HEADER_TIMEOUT_S)"
                )
                self._write_problem(STATUS_LINE_408, problem_bytes(408, "request_timeout", detail))
            self.transport.close()
        else:  # body
            cast(dict[str, Any], self.scope)[TIMEOUT_KEY] = self.body_timeout_s  # the cycle's too
            self.transport.close()

    def _in_progress(self) -> bool:
        """True while a request of this connection is being read, run or answered."""
        return not self._in_head or (self.cycle is not None and not self.cycle.response_complete)

    # -------------------------------------------------------------- connection bound

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._waiting_since = self.loop.time()
        self._arm("head", self.header_timeout_s)
        if len(self.connections) > self.max_connections:
            self._make_room()

    def _make_room(self) -> None:
        waiting = [
            c
            for c in self.connections
            if c is not self
            and isinstance(c, GuardedHttpToolsProtocol)
            and not c._in_progress()
            and not c.transport.is_closing()
        ]
        if waiting:
            oldest = min(waiting, key=lambda c: c._waiting_since)
            _log_close(
                f"{len(self.connections) - 1} connections (DATARAX_MAX_CONNECTIONS "
                f"{self.max_connections}): closed the one waiting longest without a request"
            )
            oldest.transport.abort()
        elif len(self.connections) > self.max_connections + HEALTH_ROOM:
            _log_close(
                f"{len(self.connections) - 1} connections, each with a request in progress: "
                "refused a new one"
            )
            self.transport.abort()
        else:
            self._over_bound = True

    # ---------------------------------------------------------------- parser events

    def data_received(self, data: bytes) -> None:
        if self._in_head and self._timer_kind != "head" and not self._draining:
            self._arm("head", self.header_timeout_s)  # the first byte of a kept-alive head
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._disarm("head")
        if self._over_bound and not _is_health(self.url.split(b"?", 1)[0]):
            detail = (
                f"the service holds {self.max_connections} connections "
                "(DATARAX_MAX_CONNECTIONS), each with a request in progress; retry shortly"
            )
            self._answer_instead = (STATUS_LINE_503, 503, "too_many_connections", detail)
            raise _HeadRefused
        super().on_headers_complete()
        self._arm("body", self.body_timeout_s)

    def on_body(self, body: bytes) -> None:
        if self._timer_kind == "body":
            self._arm("body", self.body_timeout_s)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm("body")
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._waiting_since = self.loop.time()

    def send_400_response(self, msg: str) -> None:
        if self._answer_instead is not None:
            status_line, status, code, detail = self._answer_instead
            self._answer_instead = None
            body = problem_bytes(status, code, detail)
            self._write_problem(status_line, body, b"retry-after: 1\r\n")
            self.transport.close()
            return
        super().send_400_response(msg)

    # ---------------------------------------------------------------- flow control

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._timer_kind != "write":
            self._arm("write", self.write_timeout_s)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._disarm("write")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
