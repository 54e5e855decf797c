"""Small bodies are decoded on the event loop, larger ones in a worker thread."""

from __future__ import annotations

import threading

import anyio

from app.core.threads import INLINE_BODY_BYTES, run_for_body


def test_small_bodies_run_inline_and_large_ones_in_a_thread():
    async def where(size: int) -> threading.Thread:
        return await run_for_body(threading.current_thread, size)

    async def main() -> tuple[threading.Thread, threading.Thread, threading.Thread]:
        return (
            threading.current_thread(),
            await where(INLINE_BODY_BYTES),
            await where(INLINE_BODY_BYTES + 1),
        )

    loop, small, large = anyio.run(main)
    assert small is loop
    assert large is not loop


def test_the_result_and_errors_come_back_either_way():
    async def main() -> int:
        return await run_for_body(lambda: 42, INLINE_BODY_BYTES * 4)

    assert anyio.run(main) == 42

    def fails() -> None:
        raise ValueError("bad body")

    async def failing() -> None:
        await run_for_body(fails, INLINE_BODY_BYTES * 4)

    try:
        anyio.run(failing)
    except ValueError as exc:
        assert str(exc) == "bad body"
    else:
        raise AssertionError("the worker's error was lost")
