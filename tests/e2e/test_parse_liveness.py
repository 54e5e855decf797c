"""``/health/live`` while the slowest JSON bodies the limits allow are parsed (issue 41).

Against the real server (``datarax-serve``) at ``DATARAX_MAX_BODY_MB``'s default, 64 MiB.
Parsing is one C call that holds the GIL (orjson, then numpy and the garbage collector
over what it made), in whichever thread it runs: 64 MiB of values nested 60 levels (33M
Python lists) held ``/health/live`` for 17-60 s. So a JSON body is counted before it is
parsed (``app.codecs.json_arrays.check_json_counts``): at most 2,097,152 values and
524,288 arrays and objects, else 422 ``invalid_json`` at once; and bodies over 1 MiB are
parsed one at a time (``app.core.threads``), so three do not hold the GIL back to back.
The slowest bodies within those counts are posted here, on every route class:

- metrics reduce: 512k rows of 4 12-digit floats (both counts at their bound);
- metrics collect: 512k one-value metrics (the array count's bound);
- a job push, single and batch: the same rows as one metric;
- session steps: the same rows as inputs;
- a route with a body model (a plan): ``batch_shape`` holding 1M one-item arrays (422);
- and the bodies that held health for seconds before, refused before parsing.

A poller process GETs ``/health/live`` every 50 ms on its own connection while one, then
three, of these bodies are parsed; each body goes up on a raw socket whole but its last
byte, and the last bytes go together, so every parse starts after every upload. Timings
are printed (``pytest -s``), never asserted: the assertion is structural. Where a body's
answer takes over 2 s after its last byte, that time is cut into parts of at least 1 s,
and health must have answered within every part (no stall of a part's length).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.codecs.json_arrays import MAX_JSON_CONTAINERS
from tests.helpers import PROBLEM_TYPE, ServiceProcess

pytestmark = pytest.mark.slow

MIB = 2**20
MAX_BODY = 64 * MIB  # DATARAX_MAX_BODY_MB's default
PERIOD_S = 0.05  # the poller's pace: a liveness checker's, not a wait for anything
PARTS = 8
SOCKET_TIMEOUT_S = 300.0
GIB = 2**30
ONE_BODY_MEMORY = 2 * GIB
THREE_BODIES_MEMORY = 4 * GIB
ROWS = MAX_JSON_CONTAINERS - 64  # arrays a body may hold, less the wrapping objects
ROW = "[0.123456789012,0.123456789012,0.123456789012,0.123456789012]"  # 32 MiB in all


def _rows(prefix: str, suffix: str, count: int = ROWS) -> bytes:
    """``prefix`` + ``count`` rows of 4 floats + ``suffix``: both counts at their bound."""
    return (prefix + ",".join([ROW] * count) + suffix).encode()


def _nested(levels: int, inner: str = "1") -> str:
    return "[" * levels + inner + "]" * levels


def _filled(prefix: str, item: str, suffix: str) -> bytes:
    """``prefix`` + ``item``, ``item``, ... + ``suffix``: as many as fit in MAX_BODY bytes."""
    count = (MAX_BODY - len(prefix) - len(suffix) + 1) // (len(item) + 1)
    return (prefix + ",".join([item] * count) + suffix).encode()


def _many_metrics(count: int = ROWS) -> bytes:
    """``{"metrics": {"m0000000": [1], ...}}``: one-value metrics (one device)."""
    return ('{"metrics":{' + ",".join(f'"m{i:07d}":[1]' for i in range(count)) + "}}").encode()


@dataclass(frozen=True)
class SlowBody:
    """The slowest body measured for a route class, and the answer it gets."""

    method: str
    path: str  # may name {mesh} and {session}
    build: Any  # () -> bytes
    status: int
    code: str | None = None  # a problem's code; None for a success

    def url(self, mesh: str, session: str) -> str:
        return self.path.format(mesh=mesh, session=session)


SLOWEST = {
    "reduce-rows": SlowBody(
        "POST", "/v1/metrics/reduce", lambda: _rows('{"metrics":{"m":[', "]}}"), 200
    ),
    "collect-512k-metrics": SlowBody("POST", "/v1/metrics/collect", _many_metrics, 200),
    "job-push-rows": SlowBody(
        "POST",
        "/v1/jobs/parse-liveness-single/metrics",
        lambda: _rows('{"step":1,"metrics":{"m":[', "]}}"),
        201,
    ),
    "job-batch-rows": SlowBody(
        "POST",
        "/v1/jobs/parse-liveness-batch/metrics/batch",
        lambda: _rows('{"points":[{"step":1,"metrics":{"m":[', "]}}]}"),
        201,
    ),
    "session-steps-rows": SlowBody(
        "POST",
        "/v1/sessions/{session}/steps",
        lambda: _rows('{"steps":1,"batch":{"inputs":[', "]}}"),
        422,
        "missing_targets",
    ),
    "plan-body-arrays": SlowBody(
        "POST",
        "/v1/meshes",
        lambda: _rows('{"axes":{"data":-1},"num_devices":8,"batch_shape":[', "]}", ROWS // 4),
        422,
        "validation_error",
    ),
}

REFUSED = {  # what held health for 10-60 s before the counts: 422 before parsing now
    "reduce-nested-60": (
        "/v1/metrics/reduce",
        lambda: _filled('{"metrics":{"m":[', _nested(60), "]}}"),
    ),
    "collect-4m-metrics": ("/v1/metrics/collect", lambda: _many_metrics(4_000_000)),
    "job-push-one-digit": (
        "/v1/jobs/refused/metrics",
        lambda: _filled('{"step":1,"metrics":{"m":[', "1", "]}}"),
    ),
    "plan-nested-60": (
        "/v1/meshes",
        lambda: _filled('{"axes":{"data":-1},"batch_shape":[', _nested(60), "]}"),
    ),
}


def _memory_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def _need_memory(needed: int) -> None:
    available = _memory_available()
    if available < needed:
        pytest.skip(
            f"SKIPPED: needs {needed / GIB:.0f} GiB of memory available, this host has "
            f"{available / GIB:.1f} GiB (the slowest bodies parse into ~3.5 GiB each)"
        )


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("parse-liveness")
    with ServiceProcess(tmp / "datarax.sqlite", tmp / "server.log") as service:
        service.wait_ready()
        with service.client(timeout=120) as client:
            plan = client.post("/v1/meshes", json={"axes": {"data": 8}})
            assert plan.status_code == 201, plan.text[:300]
            mesh = plan.json()["id"]
            made = client.post(
                f"/v1/meshes/{mesh}/sessions", json={"model": {"kind": "mlp", "features": [4, 4]}}
            )
            assert made.status_code == 201, made.text[:300]
        yield service, mesh, made.json()["id"]


# ------------------------------------------------------------------------ the poller


def _health_once(sock: socket.socket) -> None:
    sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        got = sock.recv(65536)
        if not got:
            raise ConnectionError("the server closed the health connection")
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    if not lines[0].startswith("HTTP/1.1 200"):
        raise ConnectionError(f"health answered {lines[0]!r}")
    length = next(
        int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")
    )
    while len(body) < length:
        got = sock.recv(65536)
        if not got:
            raise ConnectionError("the server closed the health connection mid-answer")
        body += got


def _poll(port: int, started, done, results) -> None:
    """GETs /health/live every PERIOD_S on one kept-alive connection until ``done``; sends
    back ``(sent, answered)`` monotonic times (the clock is the host's, shared with the
    test process) and the errors met (a failed probe reconnects)."""
    latencies: list[tuple[float, float]] = []
    errors: list[str] = []
    sock = socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_S)
    try:
        _health_once(sock)  # connected and answered before measuring
        started.set()
        while not done.is_set():
            sent = time.monotonic()
            try:
                _health_once(sock)
            except OSError as err:
                errors.append(f"{type(err).__name__}: {err}")
                sock.close()
                sock = socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_S)
                continue
            answered = time.monotonic()
            latencies.append((sent, answered))
            time.sleep(max(0.0, PERIOD_S - (answered - sent)))
    finally:
        sock.close()
        results.send((latencies, errors))


# ------------------------------------------------------------------- the slow requests


@dataclass
class Exchange:
    """One slow request on a raw socket: its times (monotonic) and its answer."""

    started: float = 0.0  # first byte sent
    sent: float = 0.0  # last byte sent
    answered: float = 0.0  # first byte of the answer received
    status: int = 0
    headers: dict[str, str] | None = None
    body: bytes = b""
    error: BaseException | None = None


def _exchange(port: int, method: str, path: str, body: bytes, go, out: Exchange) -> None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_S) as sock:
            head = (
                f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            ).encode("latin-1")
            view = memoryview(body)
            out.started = time.monotonic()
            sock.sendall(head)
            sock.sendall(view[:-1])
            go.wait(SOCKET_TIMEOUT_S)  # every body is up but its last byte
            sock.sendall(view[-1:])
            out.sent = time.monotonic()
            data = sock.recv(65536)
            out.answered = time.monotonic()
            chunks = [data]
            while data:
                data = sock.recv(MIB)
                chunks.append(data)
        head_bytes, _, out.body = b"".join(chunks).partition(b"\r\n\r\n")
        lines = head_bytes.decode("latin-1").split("\r\n")
        out.status = int(lines[0].split()[1])
        out.headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(":") for line in lines[1:])
        }
    except BaseException as err:  # re-raised by the test's thread
        out.error = err


def _post_while_polling(
    port: int, requests: list[tuple[str, str, bytes]]
) -> tuple[list[Exchange], list[tuple[float, float]], list[str]]:
    """Posts ``requests`` at once (their parses start together) while a poller process
    probes /health/live; returns the exchanges, the probes and the poller's errors."""
    context = multiprocessing.get_context("spawn")
    started, done = context.Event(), context.Event()
    receiver, sender = context.Pipe(duplex=False)
    poller = context.Process(target=_poll, args=(port, started, done, sender), daemon=True)
    poller.start()
    try:
        assert started.wait(60), "the poller process did not start"
        go = threading.Barrier(len(requests))
        exchanges = [Exchange() for _ in requests]
        threads = [
            threading.Thread(target=_exchange, args=(port, method, path, body, go, out))
            for (method, path, body), out in zip(requests, exchanges, strict=True)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(SOCKET_TIMEOUT_S * 2)
            assert not thread.is_alive(), "a slow request did not finish"
        for out in exchanges:
            if out.error is not None:
                raise out.error
        time.sleep(4 * PERIOD_S)  # a few probes after the last answer
    finally:
        done.set()
        got = receiver.recv() if receiver.poll(60) else ([], ["the poller sent nothing"])
        poller.join(30)
        if poller.is_alive():
            poller.kill()
    latencies, errors = got
    return exchanges, latencies, errors


# -------------------------------------------------------------------- the assertions


def _answers_per_part(
    latencies: list[tuple[float, float]], out: Exchange
) -> tuple[list[int], float]:
    """How many health answers arrived in each part of the time between the body's last
    byte and its answer: parts of at least 1 s; none when that time is under 2 s."""
    phase = out.answered - out.sent
    parts = min(PARTS, int(phase))
    if parts < 2:
        return [], phase
    width = phase / parts
    hits = [0] * parts
    for _, answered in latencies:
        if out.sent <= answered < out.answered:
            hits[min(parts - 1, int((answered - out.sent) / width))] += 1
    return hits, phase


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _report(
    name: str,
    service: ServiceProcess,
    exchanges: list[Exchange],
    latencies: list[tuple[float, float]],
) -> None:
    """Prints the parse times, the health latencies while the bodies were up and the
    server's peak RSS so far."""
    assert service.proc is not None
    first = min(out.started for out in exchanges)
    last = max(out.answered for out in exchanges)
    during = sorted(end - start for start, end in latencies if end >= first and start <= last)
    worst = during[-1] if during else math.nan
    p99 = during[math.ceil(0.99 * len(during)) - 1] if during else math.nan
    for out in exchanges:
        print(
            f"\n{name}: {len(out.body)} answer bytes, status {out.status}, upload "
            f"{out.sent - out.started:.2f} s, answer {out.answered - out.sent:.2f} s after "
            "the last byte"
        )
    print(
        f"{name}: /health/live answered {len(during)} times while the bodies were up: "
        f"max {worst * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms; server peak RSS so far "
        f"{_peak_rss(service.proc.pid) / GIB:.2f} GiB"
    )


def _check_answer(body: SlowBody, out: Exchange) -> None:
    """The slow request's own answer."""
    media = (out.headers or {}).get("content-type", "")
    problem = json.loads(out.body) if media.startswith(PROBLEM_TYPE) else {}
    expected = PROBLEM_TYPE if body.code else "application/json"
    if (
        out.status != body.status
        or not media.startswith(expected)
        or (body.code and (problem.get("status"), problem.get("code")) != (body.status, body.code))
    ):
        pytest.fail(
            f"expected {body.status} {body.code or ''}, got {out.status}: {out.body[:300]!r}"
        )


def _check_live_throughout(
    name: str, exchanges: list[Exchange], latencies: list[tuple[float, float]], errors: list[str]
) -> None:
    assert not errors, f"{name}: health probes failed: {errors[:5]}"
    for out in exchanges:
        hits, phase = _answers_per_part(latencies, out)
        assert all(hits), (
            f"{name}: in the {phase:.1f} s between a body's last byte and its answer, "
            f"health answers per part of {phase / len(hits):.2f} s: {hits} (a 0: the event "
            "loop answered nothing for that long)"
        )


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", list(SLOWEST))
def test_health_answers_throughout_the_slowest_body(server, name):
    _need_memory(ONE_BODY_MEMORY)
    service, mesh, session = server
    body = SLOWEST[name]
    payload = body.build()
    assert len(payload) <= MAX_BODY
    exchanges, latencies, errors = _post_while_polling(
        service.port, [(body.method, body.url(mesh, session), payload)]
    )
    del payload
    _report(name, service, exchanges, latencies)
    _check_answer(body, exchanges[0])
    _check_live_throughout(name, exchanges, latencies, errors)


@pytest.mark.timeout(900)
def test_health_answers_throughout_three_slowest_bodies_at_once(server):
    _need_memory(THREE_BODIES_MEMORY)
    service, mesh, session = server
    body = SLOWEST["reduce-rows"]
    payload = body.build()
    url = body.url(mesh, session)
    exchanges, latencies, errors = _post_while_polling(
        service.port, [(body.method, url, payload)] * 3
    )
    del payload
    _report("three reduce-rows", service, exchanges, latencies)
    for out in exchanges:
        _check_answer(body, out)
    _check_live_throughout("three reduce-rows", exchanges, latencies, errors)


@pytest.mark.parametrize("name", list(REFUSED))
def test_bodies_past_the_counts_are_refused_before_parsing(server, name):
    service, _, _ = server
    path, build = REFUSED[name]
    payload = build()
    assert len(payload) <= MAX_BODY
    exchanges, latencies, errors = _post_while_polling(service.port, [("POST", path, payload)])
    del payload
    _report(name, service, exchanges, latencies)
    out = exchanges[0]
    problem = json.loads(out.body)
    assert (out.status, problem["code"]) == (422, "invalid_json"), out.body[:300]
    assert "send large arrays as npz" in problem["detail"], problem
    assert not errors, errors


BODY_MODEL_ROUTES = [
    ("POST", "/v1/meshes", '{{"axes": {{"data": {n}}}}}'),
    ("POST", "/v1/meshes/{mesh}/sessions", '{{"model": {{"kind": "mlp", "features": [{n}]}}}}'),
    ("POST", "/v1/meshes/{mesh}/launch", '{{"target": "maxtext", "x": {n}}}'),
    ("POST", "/v1/meshes/{mesh}/compile-checks", '{{"steps": {n}}}'),
    ("POST", "/v1/calibrations", '{{"hardware": "x", "x": {n}}}'),
    ("POST", "/v1/recommendations", '{{"num_devices": {n}}}'),
    ("PATCH", "/v1/jobs/parse-liveness-patch", '{{"finished": {n}}}'),
]


@pytest.mark.parametrize(
    ("method", "path", "template"),
    BODY_MODEL_ROUTES,
    ids=[f"{method}-{path}" for method, path, _ in BODY_MODEL_ROUTES],
)
def test_body_models_take_integers_of_at_most_20_digits(server, method, path, template):
    # FastAPI's json.loads took any integer below 4,300 digits (thousands of them held the
    # event loop for seconds); the service's parser refuses a 21-digit one at once.
    service, mesh, _ = server
    url = path.format(mesh=mesh)
    headers = {"Content-Type": "application/json"}
    with service.client() as client:
        long = client.request(method, url, content=template.format(n="9" * 4299), headers=headers)
        assert long.status_code == 422, long.text[:300]
        assert long.headers["content-type"].startswith(PROBLEM_TYPE), long.headers
        assert long.json()["code"] == "invalid_json", long.json()
        assert "4299 digits" in long.json()["detail"], long.json()
        twenty = client.request(method, url, content=template.format(n="9" * 20), headers=headers)
        assert twenty.json().get("code") != "invalid_json", twenty.text[:300]
