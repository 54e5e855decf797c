"""Readiness and job pushes while heavy requests fill the heavy lane, then hang up.

    .venv/bin/python -m benchmarks.heavy_work [--json]

``run() -> dict`` (for ``make bench``): against the real server (2 heavy slots, 8 queue
places, the defaults), 16 recommendations whose search would take minutes (tpu-v5e 4x4 x
256 slices, 6 axes, a model that fits nowhere: 162,162 candidates, every one priced and
re-searched; ``DATARAX_MAX_SEARCH_SPACE=200000`` lets them in) are sent on raw
connections. Measured, as medians of ``ROUNDS`` calls each:

- ``idle_*_ms``: ``GET /health/ready`` and a single-step job push on the idle server;
- ``full_*_ms``: the same while the heavy lane is full (2 running, 8 waiting; the other
  6 were answered 503 ``busy``);
- ``after_*_ms``: the same just after the 16 clients hung up;
- ``slot_free_s``: from the hang-ups until a small recommendation gets a slot again (the
  abandoned searches stop within ~0.1 s instead of running for minutes).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import time
from typing import Any

import httpx

from benchmarks.server import running_server

ROUNDS = 9
HEAVY = {
    "hardware": "tpu-v5e",
    "topology": "4x4",
    "slices": 256,
    "axes": ["data", "fsdp", "tensor", "batch", "replica", "model"],
    "model": {"kind": "transformer", "layers": 80, "d_model": 8192, "d_ff": 28672,
              "heads": 64, "kv_heads": 8, "vocab": 128256, "seq_len": 8192},
    "global_batch": 256,
    "allow_split_physical_axes": True,
}  # fmt: skip
SMALL = {
    "hardware": "tpu-v5e",
    "topology": "4x4",
    "slices": 2,
    "model": {**HEAVY["model"], "layers": 4, "d_model": 1024, "d_ff": 4096, "heads": 8,
              "vocab": 32000, "seq_len": 2048},
    "global_batch": 64,
}  # fmt: skip


def _raw_post(base: str, path: str, body: dict) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=60)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


def _wait_full(client: httpx.Client) -> None:
    """Returns once a probe is refused 503 busy: the 16 heavy requests fill the lane. A
    probe that was queued instead (it came before them) times out and hangs up, which
    abandons it."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if client.post("/v1/recommendations", json=SMALL, timeout=3).status_code == 503:
                return
        except httpx.ReadTimeout:
            continue
    raise RuntimeError("the heavy lane never filled")


def _latencies(client: httpx.Client, step0: int) -> tuple[float, float]:
    """Median ms of ``GET /health/ready`` and of a one-step job push."""
    ready, push = [], []
    for i in range(ROUNDS):
        started = time.perf_counter()
        answer = client.get("/health/ready")
        ready.append(time.perf_counter() - started)
        assert answer.status_code == 200, answer.text
        started = time.perf_counter()
        answer = client.post(
            "/v1/jobs/bench-heavy/metrics",
            json={"step": step0 + i, "metrics": {"loss": [1.0, 2.0, 3.0, 4.0]}},
        )
        push.append(time.perf_counter() - started)
        assert answer.status_code in (200, 201), answer.text
    return statistics.median(ready) * 1e3, statistics.median(push) * 1e3


def run() -> dict[str, Any]:
    # The heavy search (162,162 candidates) passes the default DATARAX_MAX_SEARCH_SPACE.
    env = {"DATARAX_MAX_SEARCH_SPACE": "200000"}
    with running_server(env) as base, httpx.Client(base_url=base, timeout=60) as client:
        out: dict[str, Any] = {"bench": "heavy_lane", "heavy_requests": 16}
        out["idle_ready_ms"], out["idle_push_ms"] = _latencies(client, 0)
        socks = [_raw_post(base, "/v1/recommendations", HEAVY) for _ in range(16)]
        try:
            _wait_full(client)
            out["full_ready_ms"], out["full_push_ms"] = _latencies(client, 100)
        finally:
            for sock in socks:
                sock.close()
            hung_up = time.monotonic()
        while client.post("/v1/recommendations", json=SMALL).status_code == 503:
            if time.monotonic() - hung_up > 120:
                raise RuntimeError("no heavy slot came free within 120 s")
            time.sleep(0.05)
        out["slot_free_s"] = round(time.monotonic() - hung_up, 3)
        out["after_ready_ms"], out["after_push_ms"] = _latencies(client, 200)
        for key, value in out.items():
            if key.endswith("_ms"):
                out[key] = round(value, 2)
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    result = run()
    print(json.dumps(result) if args.json else result)


if __name__ == "__main__":
    main()
