"""The batch pushers (datarax.client._pusher): at most in_flight batches unanswered, and the
first refusal raised at flush. Against real HTTP servers on free ports."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from datarax.client import ApiError, AsyncClient, Client
from datarax.client.answers import BatchResult
from tests.datarax.client.test_clients import Scripted, _problem


def _batch_answer(created: int) -> bytes:
    """The JSON of a BatchResult that stored ``created`` points."""
    return json.dumps(
        {
            "job": "j",
            "points": created,
            "created": created,
            "unchanged": 0,
            "completed_steps": created,
            "received_at": "2026-12-01T08:00:00Z",
            "warnings": [],
        }
    ).encode()


def test_pusher_keeps_at_most_in_flight_batches_unanswered():
    # A server that holds each request 0.2 s and counts how many it holds at once: the
    # pusher fills its 3 slots and never sends a 4th before an answer frees one.
    held = peak = 0
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            nonlocal held, peak
            self.rfile.read(int(self.headers["content-length"]))
            with lock:
                held += 1
                peak = max(peak, held)
            time.sleep(0.2)
            with lock:
                held -= 1
            body = _batch_answer(1)
            self.send_response(201)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            del args

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with Client(url) as api, api.pusher("j", in_flight=3, source="", sources=1) as pusher:
            for step in range(7):
                pusher.push_arrays([step], {"loss": np.ones((1, 2))})
        assert peak == 3 and len(pusher.results) == 7
        assert all(isinstance(r, BatchResult) and r.created == 1 for r in pusher.results)
    finally:
        server.shutdown()
        server.server_close()


def test_async_pusher_raises_the_first_refusal_at_flush():
    created = (201, {"content-type": "application/json"}, _batch_answer(2))
    answers = [created, _problem(409, "step_conflict"), created]

    async def main():
        async with AsyncClient(server.url) as api:
            pusher = api.pusher("j", in_flight=1, source="", sources=1)
            for first in (0, 2, 4):
                await pusher.push_arrays([first, first + 1], {"loss": np.ones((2, 2))})
            with pytest.raises(ApiError) as info:
                await pusher.flush()
            return info.value, pusher.results

    with Scripted(answers) as server:
        error, results = asyncio.run(main())
    assert error.code == "step_conflict" and results == [json.loads(_batch_answer(2))]
    assert isinstance(results[0], BatchResult) and results[0].created == 2
    assert len(server.seen) == 3  # the batch after the refused one was still sent
