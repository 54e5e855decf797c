"""HTTP for dashboards: strong ETags with 304s, ``Cache-Control`` per resource, gzip, CORS.

:class:`HttpCacheMiddleware` is a pure ASGI middleware. After the router has matched (it
stores the route in ``scope["route"]``), it looks the route template up in
:data:`POLICIES`:

- ``Cache-Control`` as the table says, unless the route set its own;
- for resources marked ``etag`` (plans, layouts, job history): a strong ETag, the BLAKE2b
  digest (128 bits) of the identity body, and a bodiless 304 when ``If-None-Match`` names
  it. The gzip representation's tag is the same digest with ``.gz`` appended (a strong tag
  names one representation, RFC 9110 8.8.3); either matches.

Every answer whose type is JSON, SVG, HTML, CSS or JavaScript and whose body is at least
:data:`MIN_GZIP_BYTES` is gzip-compressed when ``Accept-Encoding`` allows it, with
``Vary: Accept-Encoding``. Small answers pass through untouched, and a request that accepts
no gzip and is not a GET/HEAD passes through without the middleware looking at its answer,
so the hot metric routes pay for one scan of the request headers (see docs/CACHING.md
for the measured rates).

Memory and time: an answer to compress or tag is held once (the route built it whole
anyway) plus its compressed copy. Bodies over :data:`INLINE_BYTES` are hashed and
compressed in a worker thread, never on the event loop. Compressed bodies of tagged
answers are kept in an LRU of at most :data:`GZIP_CACHE_BYTES`, keyed by the tag: the
8.4 MB answer of a 65,536-device plan is compressed once, not at every poll.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import anyio.to_thread
from isal import isal_zlib
from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MIN_GZIP_BYTES = 1024
"""Answers below this are sent as they are: gzip's header and the CPU cost buy nothing."""

INLINE_BYTES = 256 * 1024
"""Bodies up to this size are hashed and compressed on the event loop (well under a
millisecond); larger ones in a worker thread."""

GZIP_CACHE_BYTES = 64 * 1024 * 1024
"""Upper bound of the compressed bodies kept for tagged answers."""

GZIP_LEVEL = 1
"""isal's levels are 0-3; level 1 compresses JSON plans about 10x at several hundred MB/s."""

COMPRESSIBLE = (
    b"application/json",
    b"application/problem+json",
    b"image/svg+xml",
    b"text/",
    b"application/javascript",
    b"text/javascript",
)

NO_STORE = "no-store"
REVALIDATE = "no-cache"


@dataclass(frozen=True)
class Policy:
    """What answers of one route template get: ``Cache-Control`` and whether to tag them."""

    cache_control: str
    etag: bool = False


PLAN_CACHE = "private, max-age=300"
"""A plan's content never changes (ids are never reused); five minutes bound how long a
browser may still show a plan that was deleted. After that it revalidates with its ETag."""

POLICIES: dict[str, Policy] = {
    "/v1/meshes/{mesh_id}": Policy(PLAN_CACHE, etag=True),
    "/v1/meshes/{mesh_id}/layout.svg": Policy(PLAN_CACHE, etag=True),
    "/v1/jobs/{job}/metrics": Policy(REVALIDATE, etag=True),
    "/v1/meshes": Policy(REVALIDATE),
    "/v1/jobs": Policy(REVALIDATE),
    "/v1/sessions": Policy(REVALIDATE),
    "/v1/sessions/{session_id}": Policy(REVALIDATE),
    "/v1/devices": Policy(REVALIDATE),
    "/v1/hardware": Policy("public, max-age=3600"),
    "/v1/hardware/{name}": Policy("public, max-age=3600"),
    "/v1/compile-checks/{check_id}": Policy(REVALIDATE),
    "/health/live": Policy(NO_STORE),
    "/health/ready": Policy(NO_STORE),
    "/metrics": Policy(NO_STORE),
    "/openapi.json": Policy(REVALIDATE, etag=True),
}
"""Route template -> policy. Answers of other routes keep the headers their route set."""


def _request_headers(scope: Scope) -> tuple[bytes | None, bytes | None]:
    """``Accept-Encoding`` and ``If-None-Match`` (repeated ones joined), in one pass."""
    accept: list[bytes] = []
    match: list[bytes] = []
    for key, value in scope["headers"]:
        if key == b"accept-encoding":
            accept.append(value)
        elif key == b"if-none-match":
            match.append(value)
    return (
        (accept[0] if len(accept) == 1 else b",".join(accept)) if accept else None,
        (match[0] if len(match) == 1 else b",".join(match)) if match else None,
    )


MAX_CACHED_HEADER = 256
"""Header values up to this length have their parse cached (at most 256 of them, so the
cache holds at most 64 KiB of keys); longer ones, which no real client sends, are parsed
each time and never kept: a cache keyed by unbounded client strings lets a client fill
memory with distinct values."""


MAX_NEGOTIATED = 1024
"""Only the first KiB of an ``Accept-Encoding`` or ``Accept`` (up to its last comma) is
read: real ones are tens to hundreds of bytes, and parsing every item of a 64 KiB list of
empty items took 350 ms of the event loop (measured on the 2-core test machine, before
this bound; after it, 0.04 ms)."""


def negotiated_part(value: bytes) -> bytes:
    """``value``, or its first :data:`MAX_NEGOTIATED` bytes up to their last comma (whole
    items only; nothing when the first item is longer)."""
    if len(value) <= MAX_NEGOTIATED:
        return value
    head = value[:MAX_NEGOTIATED]
    return head[: max(head.rfind(b","), 0)]


def accepts_gzip(accept_encoding: bytes | None) -> bool:
    """True when ``Accept-Encoding`` allows gzip: ``gzip`` or ``*`` with a q above 0, and
    gzip not refused by name (``gzip;q=0``). Past :data:`MAX_NEGOTIATED` bytes only the
    leading items count."""
    if not accept_encoding:
        return False
    if len(accept_encoding) <= MAX_CACHED_HEADER:
        return _accepts_gzip_cached(accept_encoding)
    return _accepts_gzip(negotiated_part(accept_encoding))


def _accepts_gzip(accept_encoding: bytes) -> bool:
    gzip_q = star_q = None
    for item in accept_encoding.decode("latin-1").lower().split(","):
        if not item or item.isspace():
            continue  # an empty list item (RFC 9110 5.6.1 allows them)
        coding, *params = (part.strip() for part in item.split(";"))
        q = 1.0
        for param in params:
            key, _, raw = param.partition("=")
            if key.strip() == "q":
                try:
                    q = float(raw)
                except ValueError:
                    q = 0.0
        if coding in ("gzip", "x-gzip"):
            gzip_q = q
        elif coding == "*":
            star_q = q
    if gzip_q is not None:
        return gzip_q > 0
    return star_q is not None and star_q > 0


_accepts_gzip_cached = functools.lru_cache(maxsize=256)(_accepts_gzip)
"""Clients send a handful of short distinct values: each parsed once."""


MAX_IF_NONE_MATCH = 4096
"""``If-None-Match`` values longer than this (about 100 of our tags) are treated as naming
no tag: the answer is the full 200, which is always correct (RFC 9110 13.1.2 lets a server
answer in full), and the check costs nothing however many tags a client sends."""


def etag_matches(if_none_match: bytes | None, base_tag: str) -> bool:
    """``If-None-Match`` names this resource's tag (weak comparison, as RFC 9110 13.1.2
    asks for GET), in its identity or gzip form, or is ``*``. Values over
    :data:`MAX_IF_NONE_MATCH` bytes match nothing."""
    if not if_none_match or len(if_none_match) > MAX_IF_NONE_MATCH:
        return False
    for item in if_none_match.decode("latin-1").split(","):
        tag = item.strip()
        if tag == "*":
            return True
        tag = tag.removeprefix("W/").strip('"')
        if tag.removesuffix(".gz") == base_tag:
            return True
    return False


def body_tag(body: bytes) -> str:
    """The strong tag of an identity body (without quotes)."""
    return hashlib.blake2b(body, digest_size=16).hexdigest()


def gzip_bytes(body: bytes, level: int = GZIP_LEVEL) -> bytes:
    """``body`` as a gzip member (isal: several times faster than zlib at its level 1)."""
    compressor = isal_zlib.compressobj(level, isal_zlib.DEFLATED, 16 + isal_zlib.MAX_WBITS)
    return compressor.compress(body) + compressor.flush()


class _GzipCache:
    """Compressed bodies of tagged answers, least recently used first out."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.size = 0
        self.items: OrderedDict[str, bytes] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, tag: str) -> bytes | None:
        with self.lock:
            value = self.items.get(tag)
            if value is not None:
                self.items.move_to_end(tag)
            return value

    def put(self, tag: str, value: bytes) -> None:
        if len(value) > self.max_bytes:
            return
        with self.lock:
            if tag in self.items:
                return
            self.items[tag] = value
            self.size += len(value)
            while self.size > self.max_bytes:
                _, dropped = self.items.popitem(last=False)
                self.size -= len(dropped)


def _set_header(headers: list[tuple[bytes, bytes]], name: bytes, value: bytes) -> None:
    headers[:] = [(k, v) for k, v in headers if k != name]
    headers.append((name, value))


def _add_vary(headers: list[tuple[bytes, bytes]], value: bytes) -> None:
    for i, (key, existing) in enumerate(headers):
        if key == b"vary":
            if value.lower() not in existing.lower():
                headers[i] = (key, existing + b", " + value)
            return
    headers.append((b"vary", value))


class HttpCacheMiddleware:
    """ETags and 304s, ``Cache-Control`` and gzip, as the module docstring says."""

    def __init__(self, app: ASGIApp, gzip_cache_bytes: int = GZIP_CACHE_BYTES):
        self.app = app
        self.gzip_cache = _GzipCache(gzip_cache_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        accept_encoding, if_none_match = _request_headers(scope)
        gzip_ok = accepts_gzip(accept_encoding)
        method = scope["method"]
        reading = method in ("GET", "HEAD")  # HEAD gets the policy's headers, never a tag
        if not gzip_ok and not reading:
            await self.app(scope, receive, send)
            return
        if method != "GET":
            if_none_match = None
        held: Message | None = None
        chunks: list[bytes] = []
        passing = False

        async def send_wrapper(message: Message) -> None:
            nonlocal held, passing
            if passing:
                await send(message)
                return
            if message["type"] == "http.response.start":
                route = scope.get("route")
                policy = POLICIES.get(getattr(route, "path", ""), None) if reading else None
                headers = message.get("headers", [])
                if policy is not None and not any(k == b"cache-control" for k, _ in headers):
                    headers = [*headers, (b"cache-control", policy.cache_control.encode())]
                    message = {**message, "headers": headers}
                if method == "HEAD":
                    passing = True
                    await send(message)
                    return
                if self._needs_body(message, headers, policy, gzip_ok):
                    held = message
                    return
                passing = True
                await send(message)
                return
            if held is None:  # not a start we held: nothing to do
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            start, body = held, b"".join(chunks)
            route = scope.get("route")
            policy = POLICIES.get(getattr(route, "path", ""), None)
            await self._finish(start, body, policy, gzip_ok, if_none_match, send)

        await self.app(scope, receive, send_wrapper)

    @staticmethod
    def _needs_body(
        message: Message,
        headers: list[tuple[bytes, bytes]],
        policy: Policy | None,
        gzip_ok: bool,
    ) -> bool:
        length = content_type = None
        for key, value in headers:
            if key == b"content-length":
                length = value
            elif key == b"content-type":
                content_type = value
            elif key == b"content-encoding":
                return False  # already encoded (the dashboard's own assets)
            elif key == b"etag":
                return False  # tagged by its route, which answers 304s itself (app.api.streamed)
        if length is None:
            return False  # streamed: passed on as it comes
        if policy is not None and policy.etag and message["status"] == 200:
            return True
        if not gzip_ok or content_type is None or int(length) < MIN_GZIP_BYTES:
            return False
        return content_type.lower().startswith(COMPRESSIBLE)

    async def _finish(
        self,
        start: Message,
        body: bytes,
        policy: Policy | None,
        gzip_ok: bool,
        if_none_match: bytes | None,
        send: Send,
    ) -> None:
        headers: list[tuple[bytes, bytes]] = list(start["headers"])
        status = start["status"]
        content_type = next((v for k, v in headers if k == b"content-type"), b"").lower()
        compress = gzip_ok and len(body) >= MIN_GZIP_BYTES and content_type.startswith(COMPRESSIBLE)
        tag = None
        if policy is not None and policy.etag and status == 200:
            tag = body_tag(body) if len(body) <= INLINE_BYTES else await _off_loop(body_tag, body)
            if etag_matches(if_none_match, tag):
                etag = f'"{tag}.gz"' if compress else f'"{tag}"'
                not_modified = [
                    (k, v)
                    for k, v in headers
                    if k not in (b"content-length", b"content-type", b"content-encoding")
                ]
                _set_header(not_modified, b"etag", etag.encode())
                if content_type.startswith(COMPRESSIBLE) and len(body) >= MIN_GZIP_BYTES:
                    _add_vary(not_modified, b"Accept-Encoding")
                await send({"type": "http.response.start", "status": 304, "headers": not_modified})
                await send({"type": "http.response.body", "body": b""})
                return
        if compress:
            _add_vary(headers, b"Accept-Encoding")
            packed = self.gzip_cache.get(tag) if tag else None
            if packed is None:
                inline = len(body) <= INLINE_BYTES
                packed = gzip_bytes(body) if inline else await _off_loop(gzip_bytes, body)
                if tag:
                    self.gzip_cache.put(tag, packed)
            body = packed
            _set_header(headers, b"content-encoding", b"gzip")
            _set_header(headers, b"content-length", str(len(body)).encode())
        elif content_type.startswith(COMPRESSIBLE) and len(body) >= MIN_GZIP_BYTES:
            _add_vary(headers, b"Accept-Encoding")
        if tag:
            _set_header(headers, b"etag", (f'"{tag}.gz"' if compress else f'"{tag}"').encode())
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def _off_loop[T](fn: Callable[[bytes], T], body: bytes) -> T:
    return await anyio.to_thread.run_sync(fn, body)


def cors_origins(setting: str) -> list[str]:
    """``DATARAX_CORS_ORIGINS`` (comma-separated origins, or ``*``) as a list."""
    return [origin.strip().rstrip("/") for origin in setting.split(",") if origin.strip()]


def add_cors(app: Starlette, setting: str) -> None:
    """Adds CORS for the configured origins; none configured adds nothing (same-origin only).

    Browsers on those origins may call every route, send ``Authorization`` (never a
    cookie: the API has none) and read ``ETag``, ``Location`` and ``Retry-After``.
    """
    origins = cors_origins(setting)
    if not origins:
        return
    app.add_middleware(
        CORSMiddleware,
        allow_origins=origins,
        allow_methods=["GET", "HEAD", "POST", "PATCH", "DELETE"],
        allow_headers=["Authorization", "Content-Type", "If-None-Match", "Accept"],
        expose_headers=["ETag", "Location", "Retry-After", "Content-Encoding"],
        allow_credentials=False,
        max_age=600,
    )
