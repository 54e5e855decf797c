"""Connections that hold the server, against the real ``datarax-serve`` with real sockets
(app.api.connections, app.api.streamed):

- 1,100 connections that send nothing, half a head or nothing after an answer, under a
  1,024 file-descriptor limit: the server keeps answering (health, plans, job pushes) and
  never holds more descriptors than its limit;
- connections with requests in progress up to ``DATARAX_MAX_CONNECTIONS``: health checks
  are still served, other requests are 503 ``too_many_connections``, and the requests in
  progress finish with nothing lost;
- a head that stops (nothing, half a request line, half the headers, a byte at a time, a
  kept-alive connection's next head) is 408 ``request_timeout`` or, with nothing sent, a
  plain close; a body that stops is closed and counted 408 in ``/metrics``, one log line
  and no traceback; a slow body that keeps arriving is served;
- 25 clients that ask for the largest answer (a 262,144-device plan, 25 MB) and never
  read it: the server's resident memory grows by about the stored (compressed) plan per
  client, not the answer, and the clients are dropped after ``DATARAX_WRITE_TIMEOUT_S``.

Timeouts are set short here so the tests are quick; no timing is asserted, only what the
server did (the waits are bounded generously).
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest

from app.api.connections import HEALTH_ROOM, default_max_connections
from tests.helpers import ServiceProcess, assert_problem

pytestmark = pytest.mark.timeout(300)

MIB = 2**20
FD_LIMIT = 1024
WAIT_S = 60.0  # bound on any wait for the server to act (timeouts here are 1-5 s)
BIG_PLAN = {"axes": {"data": -1}, "num_devices": 262_144, "name": "largest"}


@pytest.fixture(autouse=True)
def _enough_client_sockets():
    if not sys.platform.startswith("linux"):
        pytest.fail("file descriptors and RSS are read from /proc (Linux only)")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.fail(f"the tests open 1,100+ sockets; the hard file limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@contextlib.contextmanager
def serving(tmp_path: Path, nofile: int | None = None, **env: str):
    settings = {f"DATARAX_{k.upper()}": v for k, v in env.items()}
    with ServiceProcess(
        tmp_path / "datarax.sqlite", tmp_path / "server.log", env=settings, nofile=nofile
    ) as service:
        service.wait_live()
        yield service


def connect(service: ServiceProcess, send: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", service.port), timeout=WAIT_S)
    if send:
        sock.sendall(send)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (a reset counts as closed)."""
    got = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            got.append(chunk)
    return b"".join(got)


def is_closed(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        while chunk := sock.recv(1 << 16):  # drain what was sent before the close
            del chunk
        return True
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        sock.setblocking(True)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def http_408_count(client: httpx.Client) -> float:
    lines = client.get("/metrics").text.splitlines()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in lines
        if line.startswith("datarax_http_requests_total{") and 'status="408"' in line
    )


def fresh_client(service: ServiceProcess, timeout: float = WAIT_S) -> httpx.Client:
    """A client that opens a new connection for every request."""
    limits = httpx.Limits(max_keepalive_connections=0)
    return httpx.Client(base_url=service.base_url, timeout=timeout, limits=limits)


def push(client: httpx.Client, step: int) -> httpx.Response:
    return client.post("/v1/jobs/held/metrics", json={"step": step, "metrics": {"loss": [1.0]}})


GET_HEAD = b"GET /health/live HTTP/1.1\r\nhost: x\r\n\r\n"


@pytest.mark.slow
def test_1100_idle_connections_under_a_1024_fd_limit_leave_it_answering(tmp_path):
    bound = default_max_connections(FD_LIMIT)
    # Long head and keep-alive timeouts: room must come from the bound, not a timer.
    with serving(tmp_path, nofile=FD_LIMIT, header_timeout_s="600", keep_alive_s="600") as svc:
        held: list[socket.socket] = []
        for i in range(1100):
            kind = i % 3
            if kind == 0:
                held.append(connect(svc))  # sends nothing
            elif kind == 1:
                held.append(connect(svc, b"POST /v1/meshes HTTP/1.1\r\nhost: x\r\ncontent-"))
            else:  # a whole request, answered, then nothing (kept alive)
                sock = connect(svc, GET_HEAD)
                assert sock.recv(65536).startswith(b"HTTP/1.1 200")
                held.append(sock)
            assert open_fds(svc.proc.pid) <= FD_LIMIT
        with fresh_client(svc) as client:
            for step in range(20):  # fresh connections, each past the bound
                assert client.get("/health/live").status_code == 200
                assert push(client, step).status_code in (200, 201, 202)
            made = client.post("/v1/meshes", json={"axes": {"data": -1}, "num_devices": 8})
            assert made.status_code == 201
            assert len(client.get("/v1/jobs/held/metrics").json()["points"]) == 20
        closed = sum(is_closed(sock) for sock in held)
        # Every connection past the bound closed one that waited longest.
        assert closed >= 1100 - bound, (closed, bound)
        assert open_fds(svc.proc.pid) <= FD_LIMIT
        log = svc.log_tail(200_000)
        assert "closed the one waiting longest without a request" in log
        lines = log.count("closed the one waiting longest without a request")
        assert lines <= 20, lines  # rate-limited: at most 10 lines per 10 s, the rest counted
        assert "Traceback" not in log and "Too many open files" not in log
        for sock in held:
            sock.close()


def test_busy_connections_leave_room_for_health_checks(tmp_path):
    bound = 20
    with serving(tmp_path, max_connections=str(bound), body_timeout_s="600") as svc:
        body = b'{"axes": {"data": -1}, "num_devices": 8, "name": "busy"}'
        head = (
            b"POST /v1/meshes HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
        )
        busy = [connect(svc, head + body[:10]) for _ in range(bound)]
        time.sleep(0.5)  # let the server read every head (nothing asserted on time)
        with fresh_client(svc) as client:
            for path in ("/health/live", "/health/ready", "/health/live?again=1"):
                answer = client.get(path)
                assert answer.status_code in (200, 503), answer.text  # ready: runtime may start
                assert answer.status_code == 200 or answer.json()["code"] == "not_ready"
            refused = client.post("/v1/meshes", json={"axes": {"data": -1}, "num_devices": 8})
            problem = assert_problem(refused, 503, "too_many_connections")
            assert "DATARAX_MAX_CONNECTIONS" in problem["detail"]
            assert refused.headers["retry-after"] == "1"
            assert refused.headers["connection"] == "close"
            # Past the health room too, a health check is still served: the idle ones are
            # closed to make room for it.
            idle = [connect(svc) for _ in range(HEALTH_ROOM + 5)]
            assert client.get("/health/live").status_code == 200
            for sock in busy:  # the requests in progress finish: nothing was lost
                sock.sendall(body[10:])
                assert sock.recv(65536).startswith(b"HTTP/1.1 201")
            plans = client.get("/v1/meshes", params={"limit": 100}).json()
            assert sum(p["name"] == "busy" for p in plans["items"]) == bound
            for sock in busy + idle:
                sock.close()


@pytest.mark.parametrize(
    "sent",
    [
        b"G",
        b"GET /health/live HT",
        b"GET /health/live HTTP/1.1\r\nhost: x\r\n",
        b"POST /v1/meshes HTTP/1.1\r\ncontent-length: 10\r\ncontent-ty",
    ],
    ids=["one-byte", "half-request-line", "half-headers", "half-post-head"],
)
def test_a_head_that_stops_is_408(tmp_path, sent):
    with serving(tmp_path, header_timeout_s="1") as svc:
        answer = read_until_closed(connect(svc, sent))
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b'"code":"request_timeout"' in answer and b"DATARAX_HEADER_TIMEOUT_S" in answer
        assert b"connection: close" in answer.lower()


def test_heads_that_never_end_silence_and_kept_alive_heads(tmp_path):
    with serving(tmp_path, header_timeout_s="1", keep_alive_s="30") as svc:
        assert read_until_closed(connect(svc)) == b""  # nothing sent: a plain close
        # A byte at a time, never finishing: the head's time counts from its first byte.
        drip = connect(svc)
        answer = b""
        for byte in b"GET /health/live HTTP/1.1\r\nx-slow: " + b"a" * 500:
            try:
                drip.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.05)
        answer = read_until_closed(drip)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        # A kept-alive connection: its next head gets the same time from its first byte.
        kept = connect(svc, GET_HEAD)
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")
        time.sleep(1.5)  # longer than the head timeout, shorter than keep-alive: still open
        kept.sendall(b"GET /health/live HTTP/1.1\r\n")
        rest = read_until_closed(kept)  # the end of the first answer, if any, then the 408
        assert b"HTTP/1.1 408" in rest and rest.count(b"HTTP/1.1 ") == 1, rest[:300]
        # A whole head in time is served as always.
        with fresh_client(svc) as client:
            assert client.get("/health/live").status_code == 200


@pytest.mark.parametrize(
    "path",
    [
        "/v1/meshes",
        "/v1/metrics/reduce",
        "/v1/jobs/slow/metrics",
        "/v1/jobs/slow/metrics/batch",
        "/v1/metrics/collect",
    ],
)
def test_a_body_that_stops_is_408_in_metrics_and_one_log_line(tmp_path, path):
    with serving(tmp_path, body_timeout_s="1") as svc, svc.client() as client:
        before = http_408_count(client)
        head = (
            f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            "content-length: 1000\r\n\r\n"
        ).encode()
        stopped = connect(svc, head + b'{"step": 1, ')
        assert read_until_closed(stopped) == b""  # closed; the 408 goes to the log and metrics
        deadline = time.monotonic() + WAIT_S
        while http_408_count(client) < before + 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert http_408_count(client) == before + 1
        log = svc.log_tail(20_000)
        assert "no body bytes for 1 s (DATARAX_BODY_TIMEOUT_S)" in log
        assert "Traceback" not in log and '"status":500' not in log


def test_a_slow_body_that_keeps_arriving_is_served(tmp_path):
    with serving(tmp_path, body_timeout_s="1") as svc:
        body = b'{"axes": {"data": -1}, "num_devices": 8, "name": "slow"}'
        sock = connect(
            svc,
            b"POST /v1/meshes HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n",
        )
        for start in range(0, len(body), 8):  # ~3.5 s in all, each pause under the timeout
            sock.sendall(body[start : start + 8])
            time.sleep(0.5)
        assert sock.recv(65536).startswith(b"HTTP/1.1 201")


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["identity", "gzip"])
def test_stalled_readers_of_the_largest_answer_hold_bounded_memory(tmp_path, encoding):
    readers = 25
    with serving(tmp_path, write_timeout_s="5") as svc, fresh_client(svc, 300) as client:
        made = client.post("/v1/meshes", json=BIG_PLAN, headers={"accept-encoding": "identity"})
        assert made.status_code == 201, made.text
        location, answer_bytes = made.headers["location"], len(made.content)
        stored = client.head(location, headers={"accept-encoding": "gzip"})
        stored_bytes = int(stored.headers["content-length"])  # the compressed plan
        assert stored_bytes < answer_bytes / 5
        time.sleep(1.0)
        before, fds = rss(svc.proc.pid), open_fds(svc.proc.pid)
        peak = before
        stalled = []
        for _ in range(readers):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", svc.port))
            head = f"GET {location} HTTP/1.1\r\nhost: x\r\naccept-encoding: {encoding}\r\n\r\n"
            sock.sendall(head.encode())
            stalled.append(sock)
        # Until the server holds every stalled reader (under load it accepts them late),
        # then until it has dropped them (its descriptors are back where they were):
        # reading one sooner would let the server send it the rest.
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and open_fds(svc.proc.pid) < fds + readers:
            peak = max(peak, rss(svc.proc.pid))
            time.sleep(0.05)
        while time.monotonic() < deadline and open_fds(svc.proc.pid) > fds:
            peak = max(peak, rss(svc.proc.pid))
            time.sleep(0.1)
        if encoding == "identity":  # gzip's 2.5 MB may all fit the kernel's socket buffers
            assert "read none of its answer" in svc.log_tail()
        growth = peak - before
        bound = readers * (stored_bytes + 2 * MIB)
        print(
            f"{readers} stalled readers ({encoding}) of a {answer_bytes / MIB:.1f} MiB answer "
            f"stored in {stored_bytes / MIB:.2f} MiB: RSS +{growth / MIB:.0f} MiB "
            f"(bound {bound / MIB:.0f} MiB; {readers} whole answers: "
            f"{readers * answer_bytes / MIB:.0f} MiB)"
        )
        assert growth < bound
        # Dropped after the write timeout: each gets at most what the buffers held.
        for sock in stalled:
            got = len(read_until_closed(sock))
            assert got < answer_bytes, got
            sock.close()
        with fresh_client(svc, 120) as client:
            whole = client.get(location, headers={"accept-encoding": encoding})
            assert whole.status_code == 200 and whole.content == made.content
