"""Where a piece of body work runs: inline on the event loop when small, else in a thread."""

from collections.abc import Callable

import anyio.to_thread

INLINE_BODY_BYTES = 64 * 1024
"""Bodies up to this size are decoded on the event loop (tens of microseconds, less than a
thread hop costs); larger ones in one worker thread, so the loop never waits on big arrays."""


async def run_for_body[T](fn: Callable[[], T], body_size: int) -> T:
    """Runs ``fn`` inline for a small body, else in a worker thread (one hop for all)."""
    if body_size <= INLINE_BODY_BYTES:
        return fn()
    return await anyio.to_thread.run_sync(fn)
