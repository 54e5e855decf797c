"""Large stored answers sent from their compressed form, a piece at a time.

A plan over 64 KiB is stored zlib-compressed (:mod:`app.storage.plans`); a 262,144-device
plan is a 25 MB answer stored in about 2.5 MB. Built whole, such an answer stayed in the
HTTP process about twice over (the text and its bytes) for as long as the client took to
read it, so 25 clients that asked for it and never read held about 1.2 GB.
:class:`CompressedAnswer` holds only the stored bytes instead and sends:

- to a client that accepts gzip, the stored deflate data framed as gzip (RFC 1952: a
  10-byte header, the deflate data of the zlib stream, its CRC-32 and length), never
  inflated at all;
- to any other client, the body inflated :data:`PIECE_BYTES` of stored data at a time.

Every piece waits until the connection's send buffer has room (uvicorn's flow control),
so a connection holds the stored bytes, one inflated piece and its send buffer, whatever
the answer's size; a client that does not read is dropped after
``DATARAX_WRITE_TIMEOUT_S`` (:mod:`app.api.connections`). ``ETag`` and 304 work as for
every other answer (:mod:`app.api.http_cache`: the same tag, ``"<tag>.gz"`` for the gzip
form): the identity body's length, tag and CRC-32 come from one inflating pass off the
event loop, remembered per plan (:data:`FACTS_CACHED` plans; a plan never changes, and
its id is never reused).
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
import zlib
from collections import OrderedDict
from dataclasses import dataclass

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.api.http_cache import _add_vary, accepts_gzip, etag_matches
from app.api.routing import JSON_MEDIA_TYPE

PIECE_BYTES = 64 * 1024
"""Stored (compressed) bytes per piece sent: about 0.6 MB inflated for a plan."""

FACTS_CACHED = 1024

GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
"""A gzip member header: deflate, no flags, no time, unknown OS (RFC 1952 section 2.3)."""


@dataclass(frozen=True)
class BodyFacts:
    """What the identity body's headers need, read from its compressed form."""

    length: int
    tag: str  # :func:`app.api.http_cache.body_tag` of the identity body
    crc32: int


def body_facts(stored: bytes) -> BodyFacts:
    """Inflates ``stored`` (a zlib stream) once, a piece at a time: length, tag, CRC-32."""
    inflater = zlib.decompressobj()
    digest = hashlib.blake2b(digest_size=16)
    length = crc = 0
    view = memoryview(stored)
    for start in range(0, len(view), PIECE_BYTES):
        piece = inflater.decompress(view[start : start + PIECE_BYTES])
        digest.update(piece)
        crc = zlib.crc32(piece, crc)
        length += len(piece)
    tail = inflater.flush()
    digest.update(tail)
    crc, length = zlib.crc32(tail, crc), length + len(tail)
    return BodyFacts(length, digest.hexdigest(), crc)


_FACTS: OrderedDict[str, BodyFacts] = OrderedDict()


async def cached_facts(key: str, stored: bytes) -> BodyFacts:
    """:func:`body_facts` of an immutable stored body, in a worker thread the first time."""
    facts = _FACTS.get(key)
    if facts is None:
        facts = await asyncio.to_thread(body_facts, stored)
        _FACTS[key] = facts
        while len(_FACTS) > FACTS_CACHED:
            _FACTS.popitem(last=False)
    else:
        _FACTS.move_to_end(key)
    return facts


class CompressedAnswer(Response):
    """A 200 JSON answer sent from a stored zlib stream (see the module docstring).

    The route must be one with an ETag policy; its ``Cache-Control`` is added by
    :class:`app.api.http_cache.HttpCacheMiddleware`, which passes answers that carry
    their own ``ETag`` unchanged.
    """

    def __init__(self, stored: bytes, facts: BodyFacts) -> None:
        super().__init__(b"", status_code=200, media_type=JSON_MEDIA_TYPE)
        self.stored = stored
        self.facts = facts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # noqa: ARG002
        wanted = (b"accept-encoding", b"if-none-match")
        headers = {k: v for k, v in scope.get("headers", []) if k in wanted}
        gzip_ok = accepts_gzip(headers.get(b"accept-encoding"))
        tag = f'"{self.facts.tag}.gz"' if gzip_ok else f'"{self.facts.tag}"'
        common = [(b"etag", tag.encode())]
        _add_vary(common, b"Accept-Encoding")
        if etag_matches(headers.get(b"if-none-match"), self.facts.tag):
            await send({"type": "http.response.start", "status": 304, "headers": common})
            await send({"type": "http.response.body", "body": b""})
            return
        deflate = memoryview(self.stored)[2:-4]  # the zlib stream less header and Adler-32
        if gzip_ok:
            length = len(GZIP_HEADER) + len(deflate) + 8
            extra = [(b"content-encoding", b"gzip")]
        else:
            length, extra = self.facts.length, []
        start_headers = [
            (b"content-type", JSON_MEDIA_TYPE.encode()),
            (b"content-length", str(length).encode()),
            *extra,
            *common,
        ]
        await send({"type": "http.response.start", "status": 200, "headers": start_headers})
        if gzip_ok:
            await self._send_gzip(deflate, send)
        else:
            await self._send_inflated(send)

    async def _send_gzip(self, deflate: memoryview, send: Send) -> None:
        await send({"type": "http.response.body", "body": GZIP_HEADER, "more_body": True})
        for start in range(0, len(deflate), PIECE_BYTES):
            piece = bytes(deflate[start : start + PIECE_BYTES])
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        trailer = struct.pack("<II", self.facts.crc32, self.facts.length & 0xFFFFFFFF)
        await send({"type": "http.response.body", "body": trailer})

    async def _send_inflated(self, send: Send) -> None:
        inflater = zlib.decompressobj()
        view = memoryview(self.stored)
        for start in range(0, len(view), PIECE_BYTES):
            piece = inflater.decompress(view[start : start + PIECE_BYTES])
            if piece:
                await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": inflater.flush()})
