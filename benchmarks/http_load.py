"""A small closed-loop HTTP/1.1 load generator on raw asyncio streams.

Pre-encoded requests over keep-alive connections, responses read by Content-Length:
a few microseconds of client work per request, so the server, not the client, sets the
rate. It only talks to the URL it is given (loopback in the benchmarks), for a bounded
time.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit


def _request_bytes(method: str, host: str, path: str, body: bytes | None) -> bytes:
    head = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: keep-alive"]
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + (body or b"")


async def _read_response(reader: asyncio.StreamReader) -> int:
    header = await reader.readuntil(b"\r\n\r\n")
    status = int(header[9:12])
    length = 0
    for line in header.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    if length:
        await reader.readexactly(length)
    return status


async def _run(base: str, request: bytes, seconds: float, concurrency: int) -> tuple[int, int]:
    url = urlsplit(base)
    deadline = time.perf_counter() + seconds
    ok = bad = 0

    async def worker() -> None:
        nonlocal ok, bad
        reader, writer = await asyncio.open_connection(url.hostname, url.port)
        try:
            while time.perf_counter() < deadline:
                writer.write(request)
                status = await _read_response(reader)
                if 200 <= status < 300:
                    ok += 1
                else:
                    bad += 1
        finally:
            writer.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ok, bad


def requests_per_second(
    base: str,
    method: str,
    path: str,
    body: bytes | None,
    *,
    seconds: float = 3.0,
    concurrency: int = 16,
) -> float:
    """Successful requests per second of ``method path`` under ``concurrency`` clients."""
    url = urlsplit(base)
    request = _request_bytes(method, url.netloc, path, body)
    start = time.perf_counter()
    ok, bad = asyncio.run(_run(base, request, seconds, concurrency))
    elapsed = time.perf_counter() - start
    if bad:
        raise RuntimeError(f"{bad} requests to {path} failed during the load run")
    return ok / elapsed
