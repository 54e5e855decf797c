"""SIGTERM against the real ``datarax-serve``, with a real training call in flight that
runs longer than the grace period (``DATARAX_SHUTDOWN_GRACE_S``):

- the server stops accepting first: a new connection is refused at once;
- a request whose bytes had arrived before the signal is answered (no reset);
- the long device call answers 503 ``shutting_down`` (problem JSON, not a 500 or a reset)
  when the grace period ends, and the server exits soon after.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.datarax.spmd.test_compile_step import _require_libtpu
from tests.helpers import ServiceProcess, assert_problem, pid_alive

GRACE_S = 2.0
# ~5.3 M parameters replicated on 8 CPU devices: tens of ms a step on 2 cores.
MODEL = {"model": {"kind": "mlp", "features": [512, 2048, 2048, 512]}}
BATCH = 256
MAX_STEPS = 20_000
LONG_CALL_S = 4 * GRACE_S + 6  # the call would run this long without the signal


def _steps(count: int) -> dict:
    return {"steps": count, "synthetic": {"seed": 0, "batch_size": BATCH}}


def _raw_request(port: int) -> socket.socket:
    """A connection the server accepted, holding one whole request whose answer is unread."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(b"GET /v1/devices HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
    return sock


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _cpu_seconds(pid: int) -> float:
    """CPU time ``pid`` has used so far, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_until_computing(pid: int, seconds: float, timeout: float = 60.0) -> None:
    """Until process ``pid`` (the idle runtime) has used ``seconds`` of CPU more than now:
    then the call that makes it compute has reached it."""
    deadline = time.monotonic() + timeout
    start = _cpu_seconds(pid)
    while _cpu_seconds(pid) - start < seconds:
        assert time.monotonic() < deadline, f"the runtime did not start computing in {timeout} s"
        time.sleep(0.02)


def _read_by_server(port: int, sock: socket.socket) -> bool:
    """Whether the server has accepted ``sock``'s connection and read what was sent on it:
    its answer (or its close) is here already, or the server's end in ``/proc/net/tcp`` has
    a socket inode (0 until ``accept()``) and an empty receive queue."""
    if select.select([sock], [], [], 0)[0]:
        return True
    local = f"0100007F:{port:04X}"  # 127.0.0.1, as the kernel writes it
    remote = f"0100007F:{sock.getsockname()[1]:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == local and fields[2] == remote:
            return int(fields[9]) != 0 and int(fields[4].split(":")[1], 16) == 0
    return False


def _wait_read_by_server(port: int, sock: socket.socket, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not _read_by_server(port, sock):
        assert time.monotonic() < deadline, f"the server did not read the request in {timeout} s"
        time.sleep(0.01)


@pytest.mark.slow
def test_sigterm_refuses_new_connections_and_answers_503_after_the_grace_period(tmp_path):
    env = {"DATARAX_SHUTDOWN_GRACE_S": str(GRACE_S), "DATARAX_MAX_STEPS_PER_CALL": str(MAX_STEPS)}
    server = ServiceProcess(tmp_path / "datarax.sqlite", tmp_path / "server.log", env=env)
    with server:
        runtime_pid = int(server.wait_ready()["runtime_pid"])
        with server.client(timeout=120) as client:
            plan = client.post("/v1/meshes", json={"axes": {"data": 8}})
            assert plan.status_code == 201, plan.text
            made = client.post(f"/v1/meshes/{plan.json()['id']}/sessions", json=MODEL)
            assert made.status_code == 201, made.text
            steps_url = f"/v1/sessions/{made.json()['id']}/steps"
            assert client.post(steps_url, json=_steps(1)).status_code == 200  # compiles
            started = time.monotonic()
            probe = client.post(steps_url, json=_steps(20))
            assert probe.status_code == 200, probe.text
            per_step = (time.monotonic() - started) / 20
        long_steps = min(MAX_STEPS, max(50, int(LONG_CALL_S / per_step)))
        assert long_steps * per_step > 2 * GRACE_S, (long_steps, per_step)

        answers: dict[str, httpx.Response | BaseException] = {}

        def long_call() -> None:
            try:
                with httpx.Client(base_url=server.base_url, timeout=120) as long_client:
                    answers["long"] = long_client.post(steps_url, json=_steps(long_steps))
            except BaseException as err:  # a reset is what the test looks for
                answers["long"] = err

        caller = threading.Thread(target=long_call, daemon=True)
        caller.start()
        # The call is in the runtime once the idle runtime computes (a few steps' CPU).
        _wait_until_computing(runtime_pid, min(0.5, max(0.1, 4 * per_step)))
        assert "long" not in answers, answers
        waiting = _raw_request(server.port)
        _wait_read_by_server(server.port, waiting)  # its request is the server's now

        signalled = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        # Stop accepting first: within a moment of the signal, new connections are refused.
        deadline = time.monotonic() + GRACE_S / 2
        refused = False
        while time.monotonic() < deadline and not refused:
            try:
                socket.create_connection(("127.0.0.1", server.port), timeout=1).close()
                time.sleep(0.05)
            except ConnectionRefusedError:
                refused = True
        assert refused, "the server still accepted connections after SIGTERM"
        assert "long" not in answers, "the long call ended before the grace period"

        head = _read_all(waiting)
        waiting.close()
        assert head.startswith((b"HTTP/1.1 200", b"HTTP/1.1 503")), head[:300]

        caller.join(timeout=GRACE_S + 60)
        answer = answers.get("long")
        assert isinstance(answer, httpx.Response), f"the long call got {answer!r}"
        assert_problem(answer, 503, "shutting_down")
        elapsed = time.monotonic() - signalled
        assert elapsed >= GRACE_S - 0.2, elapsed
        assert answer.headers.get("connection", "").lower() == "close", answer.headers

        code = server.proc.wait(timeout=60)
        # uvicorn finishes its shutdown, then raises the signal again: the status a supervisor
        # expects from a process stopped by SIGTERM (143 in a shell, -15 here), or 0.
        assert code in (0, -signal.SIGTERM), (code, server.log_tail())
        assert "Finished server process" in server.log_tail(20000), server.log_tail()
        assert "Traceback" not in server.log_tail(20000), server.log_tail()


# ------------------------------------------------- every process ends, and quietly

QUIET_ENV = (
    "JAX_PLATFORMS",
    "DATARAX_PLATFORMS",
    "ALLOW_MULTIPLE_LIBTPU_LOAD",
    "TPU_SKIP_MDS_QUERY",
)
TRACES = ("Traceback", "stack trace", "SIGTERM received", "KeyboardInterrupt", "FailureSignal")


def _children(pid: int, needle: str) -> list[int]:
    """Child processes of ``pid`` whose command line holds ``needle`` (Linux /proc)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and needle.encode() in cmdline:
            found.append(int(name))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigterm", "ctrl-c"])
def test_sigterm_and_ctrl_c_end_every_process_without_a_stack_trace(tmp_path, how):
    """SIGTERM to the HTTP process (what Docker, Kubernetes and systemd send) and SIGINT to
    its process group (Ctrl-C in a terminal) end it, its runtime and its compile worker,
    which has loaded libtpu for a TPU check; the log has no trace of any of them."""
    _require_libtpu()
    server = ServiceProcess(tmp_path / "datarax.sqlite", tmp_path / "server.log", unset=QUIET_ENV)
    with server:
        runtime_pid = int(server.wait_ready()["runtime_pid"])
        with server.client(timeout=120) as client:
            plan = client.post(
                "/v1/meshes",
                json={
                    "hardware": "tpu-v5e",
                    "topology": "2x2",
                    "ici": {"data": 4},
                    "batch_shape": [64, 128],
                },  # fmt: skip
            )
            assert plan.status_code == 201, plan.text
            url = f"/v1/meshes/{plan.json()['id']}/compile-checks"
            check = client.post(url, json={"model": {"kind": "mlp", "features": [64, 128, 64]}})
            assert check.status_code == 202, check.text
            deadline = time.monotonic() + 240
            while (body := client.get(check.headers["location"]).json())["status"] != "done":
                assert body["status"] not in ("failed", "cancelled"), body
                assert time.monotonic() < deadline, body
                time.sleep(0.1)
        workers = _children(server.proc.pid, "app.compiler")
        assert len(workers) == 1, workers  # warm, libtpu loaded by the TPU check
        assert _children(server.proc.pid, "app.runtime") == [runtime_pid]

        if how == "sigterm":
            server.proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(server.proc.pid, signal.SIGINT)  # the terminal's foreground group
        code = server.proc.wait(timeout=60)
        deadline = time.monotonic() + 30
        left = [p for p in (runtime_pid, *workers) if pid_alive(p)]
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = [p for p in left if pid_alive(p)]
        assert not left, f"still running after the service ended: {left}"
        # SIGTERM: 0 or -15 (uvicorn raises the signal again); Ctrl-C: 130 (128 + SIGINT).
        assert code in (0, -signal.SIGTERM, 130), (code, server.log_tail())
        log = server.log_tail(200_000)
        assert "Finished server process" in log, log[-3000:]
        for trace in TRACES:
            assert trace not in log, (trace, log[-3000:])
