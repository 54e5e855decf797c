"""The compile worker's entry point (``python -m app.compiler``) on its own, without the
supervisor: its command line, the ``ready`` and ``--describe`` lines, the JSON-lines
protocol (phases, a result, errors as answers, lines it drops), its signals, memory cap
and start gate, and EOF as a clean exit. The supervisor's side is in
``tests/app/workers/test_compile_worker.py``; here only tiny CPU compiles."""

from __future__ import annotations

import json
import os
import queue
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from app.compiler import __main__ as worker
from tests.helpers import PROJECT_ROOT

LINE_S = 120.0  # the ready line (JAX's start) and a tiny compile, on a loaded 2-core host
TINY = {"kind": "mlp", "features": [8, 16, 8]}


def _env(**extra: str) -> dict[str, str]:
    """The service's environment, as the supervisor passes it (the worker sets its own
    platform), with libtpu kept quiet beside other test processes."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env.update(JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1", TPU_SKIP_MDS_QUERY="1", **extra)
    return env


class Worker:
    """A real ``python -m app.compiler`` with its protocol lines (each parsed as JSON: a
    line that is not JSON fails the test) and its log read by threads."""

    def __init__(self, *args: str, **env: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.compiler", *args],
            cwd=PROJECT_ROOT,
            env=_env(**env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[dict | str | None] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._read_protocol, daemon=True).start()
        threading.Thread(target=self._read_log, daemon=True).start()

    def _read_protocol(self) -> None:
        for raw in self.proc.stdout:
            try:
                self.lines.put(json.loads(raw))
            except ValueError:
                self.lines.put(f"not JSON on the protocol: {raw!r}")
        self.lines.put(None)  # EOF

    def _read_log(self) -> None:
        for raw in self.proc.stderr:
            self.log.append(raw)

    def next(self, timeout: float = LINE_S) -> dict | None:
        """The next protocol message (``None``: the worker closed its stdout)."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"no line from the compile worker in {timeout} s; log: {self.tail()}")
        assert not isinstance(line, str), line
        return line

    def send(self, text: str) -> None:
        self.proc.stdin.write(text if text.endswith("\n") else text + "\n")
        self.proc.stdin.flush()

    def ask(self, request: dict) -> dict:
        self.send(json.dumps(request))
        return self.next()

    def tail(self) -> str:
        return "".join(self.log[-20:])[-3000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


@pytest.fixture
def start_worker():
    started: list[Worker] = []

    def start(*args: str, **env: str) -> Worker:
        started.append(Worker(*args, **env))
        return started[-1]

    yield start
    for each in started:
        each.close()


@pytest.fixture(scope="module")
def ready_worker():
    """One CPU worker with 4 devices, past its ready line, shared by the protocol tests."""
    shared = Worker("--cpu-devices", "4", "--log-level", "info")
    ready = shared.next()
    yield shared, ready
    shared.close()


def _request(cid, **fields) -> dict:
    request = {
        "id": cid,
        "target": {"kind": "cpu"},
        "axes": {"data": 4},
        "device_ids": [0, 1, 2, 3],
        "model": TINY,
        "global_batch": 8,
    }
    request.update(fields)
    return request


# ----------------------------------------------------------------------- protocol


def test_the_first_line_says_ready_for_cpu_without_device_ids(ready_worker):
    _, ready = ready_worker
    assert ready == {"ready": True, "platform": "cpu"}


def test_a_tiny_cpu_check_reports_its_phases_then_its_result(ready_worker):
    shared, _ = ready_worker
    assert shared.ask(_request("c1", hbm_bytes=10**9)) == {"id": "c1", "phase": "lowering"}
    assert shared.next() == {"id": "c1", "phase": "compiling"}
    answer = shared.next()
    assert set(answer) == {"id", "result"} and answer["id"] == "c1", answer
    result = answer["result"]
    assert result["fits"] is True and result["xla_error"] is None, result
    assert result["memory"]["hbm_bytes"] == 10**9
    assert 0 < result["memory"]["hbm_peak_bytes"] <= 10**9
    assert result["collectives"].get("all-reduce", 0) >= 1  # gradients over 4 devices
    assert result["lower_s"] >= 0 and result["compile_s"] > 0


def test_a_request_missing_fields_is_answered_as_an_error_and_the_worker_serves_on(
    ready_worker,
):
    shared, _ = ready_worker
    answer = shared.ask({"id": "k"})
    assert answer == {"id": "k", "error": {"code": "compile_failed", "detail": "KeyError: 'axes'"}}
    plan_error = shared.ask(_request("d", axes={"data": 2}, device_ids=[0, 9]))
    assert plan_error["id"] == "d" and plan_error["error"]["code"] == "devices_changed"
    assert "device id 9" in plan_error["error"]["detail"]
    assert shared.proc.poll() is None


def test_blank_and_unreadable_lines_are_dropped_without_an_answer(ready_worker):
    shared, _ = ready_worker
    shared.send("")
    shared.send("   ")
    shared.send("{not json")
    # The next answer is the next request's: nothing was sent for the three lines above.
    answer = shared.ask(_request("after", optimizer="nope"))
    assert answer["id"] == "after" and answer["error"]["code"] == "unknown_optimizer", answer
    deadline = time.monotonic() + 10
    while "unreadable request line dropped" not in "".join(shared.log):
        assert time.monotonic() < deadline, shared.tail()
        time.sleep(0.05)


def test_a_json_line_that_is_not_an_object_does_not_end_the_worker(start_worker):
    child = start_worker("--cpu-devices", "2")
    assert child.next()["ready"]
    child.send("[1]")
    child.send(json.dumps({"id": "k"}))
    assert child.next(timeout=60) == {
        "id": "k",
        "error": {"code": "compile_failed", "detail": "KeyError: 'axes'"},
    }


def test_eof_on_stdin_is_a_clean_exit(start_worker):
    child = start_worker("--cpu-devices", "2")
    assert child.next()["ready"]
    child.proc.stdin.close()
    assert child.proc.wait(timeout=60) == 0, child.tail()
    assert child.next(timeout=10) is None  # and nothing more on the protocol


def test_sigint_is_ignored_and_sigterm_ends_it_at_once(start_worker):
    child = start_worker("--cpu-devices", "2")
    assert child.next()["ready"]
    child.proc.send_signal(signal.SIGINT)
    assert child.ask({"id": "still"})["id"] == "still"  # it served on after SIGINT
    child.proc.send_signal(signal.SIGTERM)
    assert child.proc.wait(timeout=30) == -signal.SIGTERM


def test_the_start_gate_holds_the_ready_line(start_worker, tmp_path):
    child = start_worker("--cpu-devices", "2", **{worker.GATE_ENV: str(tmp_path)})
    deadline = time.monotonic() + LINE_S
    while not (tmp_path / "start.reached").exists():
        assert child.proc.poll() is None and time.monotonic() < deadline, child.tail()
        time.sleep(0.02)
    with pytest.raises(queue.Empty):
        child.lines.get(timeout=0.5)  # held at the gate: no ready line yet
    (tmp_path / "start.go").touch()
    assert child.next() == {"ready": True, "platform": "cpu"}


def test_memory_mb_caps_the_workers_address_space(start_worker):
    child = start_worker("--cpu-devices", "2", "--memory-mb", "4000")
    assert child.next()["ready"]
    limits = Path(f"/proc/{child.proc.pid}/limits").read_text()
    row = next(line for line in limits.splitlines() if line.startswith("Max address space"))
    assert row.split()[3:5] == [str(4000 * 2**20)] * 2, row


# ------------------------------------------------------------ command line, describe


def test_describe_on_cpu_prints_one_json_line_and_exits_0():
    done = subprocess.run(
        [sys.executable, "-m", "app.compiler", "--describe", "--cpu-devices", "3"],
        cwd=PROJECT_ROOT,
        env=_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=LINE_S,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    described = json.loads(lines[0])
    assert described["platform"] == "cpu" and described["jax_platform"] == "cpu"
    assert [d["id"] for d in described["devices"]] == [0, 1, 2]
    assert all(d["kind"] == "cpu" and d["bytes_limit"] is None for d in described["devices"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--platform", "tpu"], "argument --platform: invalid choice: 'tpu'"),
        (["--memory-mb", "lots"], "argument --memory-mb: invalid int value: 'lots'"),
        (["--cpu-devices"], "argument --cpu-devices: expected one argument"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ],
)
def test_a_bad_command_line_exits_2_with_the_reason_and_no_protocol(args, message):
    done = subprocess.run(
        [sys.executable, "-m", "app.compiler", *args],
        cwd=PROJECT_ROOT,
        env=_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done
    assert message in done.stderr and "usage: python -m app.compiler" in done.stderr
    assert done.stdout == ""


# ------------------------------------------------------------------- in-process


def test_handle_answers_plan_errors_with_their_codes_and_other_failures_as_compile_failed():
    sent: list[dict] = []
    worker.handle(_request(1, axes={"data": 2}, device_ids=[0, 99]), sent.append)
    worker.handle(_request(2, axes={"data": 2}, device_ids=[0, 1], optimizer="nope"), sent.append)
    worker.handle(_request(3, axes={"data": 2}, device_ids=[0, 1, 2]), sent.append)
    codes = [(m["id"], m["error"]["code"]) for m in sent]
    assert codes == [(1, "devices_changed"), (2, "unknown_optimizer"), (3, "compile_failed")]
    assert sent[2]["error"]["detail"].startswith("ValueError: cannot reshape"), sent[2]
    assert all("phase" not in m for m in sent)  # each failed before lowering


def test_cpu_environment_replaces_the_device_count_and_leaves_the_base_alone():
    base = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2 --xla_dump_to=/tmp/x"}
    env = worker.environment("cpu", 5, base)
    assert base == {"XLA_FLAGS": "--xla_force_host_platform_device_count=2 --xla_dump_to=/tmp/x"}
    assert env["XLA_FLAGS"].split() == [
        "--xla_dump_to=/tmp/x",
        "--xla_force_host_platform_device_count=5",
    ]
    assert (env["JAX_PLATFORMS"], env["TPU_SKIP_MDS_QUERY"]) == ("cpu", "1")
    assert env["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"
    with pytest.raises(ValueError, match="unknown compile worker platform 'tpu'"):
        worker.environment("tpu", 8, {})
    assert worker.memory_limits("cpu", 0) == {}


_MEMORY_DETAIL = """
import resource, sys
from app.compiler.__main__ import _memory_detail
if sys.argv[1] != "none":
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]) * 2**20, hard))
print(_memory_detail())
"""


@pytest.mark.parametrize(
    ("cap", "expected"),
    [
        ("6000", "address-space cap 6000 MiB, DATARAX_COMPILE_MEMORY_MB"),
        ("none", "the compile worker ran out of host memory"),
    ],
)
def test_out_of_memory_detail_names_the_cap(cap, expected):
    if cap == "none" and resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY:
        pytest.skip("this test process already runs under an address-space cap")
    done = subprocess.run(
        [sys.executable, "-c", _MEMORY_DETAIL, cap],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout, done.stdout
