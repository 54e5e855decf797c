"""A large history page is written off the event loop (issue 58: every path whose work
grows with its input runs off the loop). The event loop's thread's CPU time while a 500-row
page of 3,000 numbers a row (21.5 MiB) is read and written is compared with the process's:
before the fix the page was written on the loop, most of the read's CPU; now the loop only
awaits the worker thread (and joins the answer's head to its rows). CPU time, not wall
time, so a loaded machine does not change the comparison; the collector is paused while it
is measured."""

from __future__ import annotations

import gc
import time

import anyio
import orjson

from app.services.jobs.history import history
from app.services.jobs.push import push_batch
from app.storage.db import Store

ROWS, WIDTH = 500, 3000


def test_a_large_page_is_written_off_the_event_loop(tmp_path):
    store = Store(tmp_path / "jobs.sqlite")
    store.open()
    try:
        for first in range(0, ROWS, 100):
            points = [
                {"step": s, "metrics": {"w": [[s + i / WIDTH for i in range(WIDTH)]]}}
                for s in range(first, first + 100)
            ]
            anyio.run(push_batch, store, "big", orjson.dumps({"points": points}))

        async def read() -> tuple[bytes, float, float]:
            loop_cpu, all_cpu = time.thread_time(), time.process_time()
            body = await history(store, "big", limit=ROWS, max_bytes=64 << 20)
            return body, time.thread_time() - loop_cpu, time.process_time() - all_cpu

        gc.collect()
        gc.disable()
        try:
            body, on_loop, in_all = anyio.run(read)
        finally:
            gc.enable()
        answer = orjson.loads(body)
        assert len(answer["points"]) == ROWS and len(answer["points"][0]["reduced"]["w"]) == WIDTH
        print(f"page of {len(body) / 2**20:.1f} MiB: {on_loop:.3f} s of CPU on the loop's "
              f"thread, {in_all:.3f} s in all")  # fmt: skip
        assert on_loop < in_all / 2, (on_loop, in_all)
    finally:
        store.close()
