"""Where a piece of body work runs: inline on the event loop when small, else in a thread;
large bodies one at a time."""

import asyncio
from collections.abc import Callable

import anyio
import anyio.to_thread

INLINE_BODY_BYTES = 64 * 1024
"""Bodies up to this size are decoded on the event loop (tens of microseconds, less than a
thread hop costs); larger ones in one worker thread, so the loop never waits on big arrays."""


LARGE_BODY_BYTES = 1 << 20
"""Bodies above this are decoded one at a time (:func:`run_for_body`)."""

_LARGE: dict[int, anyio.CapacityLimiter] = {}


def _large_bodies() -> anyio.CapacityLimiter:
    """This event loop's one-at-a-time limiter for large bodies."""
    loop = id(asyncio.get_running_loop())
    limiter = _LARGE.get(loop)
    if limiter is None:
        limiter = _LARGE[loop] = anyio.CapacityLimiter(1)
    return limiter


async def run_for_body[T](fn: Callable[[], T], body_size: int) -> T:
    """Runs ``fn`` inline for a small body, else in a worker thread (one hop for all).

    Bodies above :data:`LARGE_BODY_BYTES` take turns: parsing one is a C call that holds
    the GIL (orjson, numpy over its lists) for up to about half a second at the JSON
    counts' bounds (``app.codecs.json_arrays.check_json_counts``), and two or three run
    at once held every thread, the event loop's too, for their sum (2.7 s for three 62
    MiB bodies). Waiting for a turn is on the event loop, which serves other requests
    meanwhile.
    """
    if body_size <= INLINE_BODY_BYTES:
        return fn()
    return await thread_for_body(fn, body_size)


async def thread_for_body[T](fn: Callable[[], T], body_size: int) -> T:
    """Runs ``fn`` in a worker thread whatever the body's size (it also writes to the
    store, say), large bodies taking turns as in :func:`run_for_body`."""
    if body_size > LARGE_BODY_BYTES:
        return await anyio.to_thread.run_sync(fn, limiter=_large_bodies())
    return await anyio.to_thread.run_sync(fn)
