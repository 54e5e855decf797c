"""The runtime's command registry and serve loop: in this process (execute, handle,
fan-out decisions), and a real ``python -m app.runtime`` process fed frames by hand."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys

import numpy as np
import pytest

from app.core import channel, errors
from app.core.channel import ArrayError
from app.runtime import server
from app.runtime.environment import runtime_environment
from datarax.distributed.metrics import MetricsError
from datarax.errors import PlanError
from tests.helpers import PROJECT_ROOT


@pytest.fixture
def registry(monkeypatch):
    """A private command registry: commands registered here vanish after the test."""
    monkeypatch.setattr(server, "COMMANDS", {})
    monkeypatch.setattr(server, "LOCAL", set())
    return server


def _answering(result: dict, arrays: dict | None = None):
    def handler(payload: dict, arrays_in: dict) -> tuple[dict, dict]:  # noqa: ARG001
        return result, arrays or {}

    return handler


def _echo_payload(payload: dict, arrays: dict) -> tuple[dict, dict]:  # noqa: ARG001
    return {"p": payload}, {}


def _raiser(exc: BaseException):
    def handler(payload: dict, arrays: dict) -> tuple[dict, dict]:  # noqa: ARG001
        raise exc

    return handler


def test_command_registers_once(registry):
    def handler(payload: dict, arrays: dict) -> tuple[dict, dict]:  # noqa: ARG001
        return {}, {}

    registry.command("one", local=True)(handler)
    registry.command("one", local=True)(handler)  # the same handler again: a re-import
    assert registry.COMMANDS == {"one": handler} and registry.LOCAL == {"one"}
    with pytest.raises(ValueError, match="'one' is already registered"):
        registry.command("one")(_answering({}))


ERRORS = [
    (errors.InvalidBatch("no targets", code="missing_targets"), 422, "missing_targets"),
    (errors.SessionLost("gone"), 410, "session_lost"),
    (PlanError("not_enough_devices", "needs 16 devices, 8 exist"), 422, "not_enough_devices"),
    (MetricsError("weights_mismatch", "3 weights for 8 devices"), 422, "weights_mismatch"),
    (ValueError("steps must be positive"), 422, "invalid_request"),
    (KeyError("id"), 500, "runtime_error"),
    (RuntimeError("boom"), 500, "runtime_error"),
]


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    ERRORS,
    ids=["service-error", "session-lost", "plan-error", "metrics-error", "value-error",
         "key-error", "runtime-error"],
)  # fmt: skip
def test_handler_errors_become_error_replies(registry, exc, status, code):
    registry.command("fails")(_raiser(exc))
    reply, arrays = registry.execute({"id": 9, "command": "fails"}, {})
    assert reply["id"] == 9 and reply["ok"] is False and arrays == {}
    error = reply["error"]
    assert (error["status"], error["code"]) == (status, code)
    assert error["title"] == errors.CODES[code].title and error["detail"]
    if status == 500:
        assert type(exc).__name__ in error["detail"]
    back = errors.from_reply(json.loads(json.dumps(error)))  # as the client sees it
    assert (back.status, back.code, back.detail) == (status, code, error["detail"])


def test_requests_the_runtime_refuses(registry):
    registry.command("ok")(_echo_payload)
    reply, _ = registry.execute({"id": 1, "command": "nope"}, {})
    assert (reply["error"]["status"], reply["error"]["code"]) == (400, "unknown_command")
    assert "'nope'" in reply["error"]["detail"]
    reply, _ = registry.execute({"id": 2, "command": "ok", "payload": [1]}, {})
    assert reply["error"]["code"] == "invalid_request" and "list" in reply["error"]["detail"]
    refused = ArrayError("unsupported_dtype", "array 'x' has dtype object")
    reply, _ = registry.execute({"id": 3, "command": "ok"}, refused)
    assert (reply["error"]["status"], reply["error"]["code"]) == (422, "unsupported_dtype")
    reply, _ = registry.execute({"id": 4, "command": "ok"}, {})
    assert reply == {"id": 4, "ok": True, "result": {"p": {}}}


def test_unsendable_results_are_the_commands_error(registry):
    registry.command("objects")(_answering({}, {"x": np.array([None], dtype=object)}))
    registry.command("not_json")(_answering({"x": {1, 2}}))
    for name, status, code in [
        ("objects", 422, "unsupported_dtype"),
        ("not_json", 500, "runtime_error"),
    ]:
        raw = b"".join(registry.handle({"id": 5, "command": name}, {}))
        length = channel.header_length(raw[:4])
        header, total = channel.decode_header(raw[4 : 4 + length])
        assert total == 0 and header["id"] == 5 and not header["ok"]
        assert (header["error"]["status"], header["error"]["code"]) == (status, code), name


def test_only_valid_group_commands_fan_out(registry):
    def handler(payload: dict, arrays: dict) -> tuple[dict, dict]:  # noqa: ARG001
        return {}, {}

    registry.command("here", local=True)(handler)
    registry.command("everywhere")(handler)
    assert not registry.fans_out({"command": "here"}, {})
    assert not registry.fans_out({"command": "no_such_command"}, {})
    assert not registry.fans_out({"command": "everywhere", "payload": "x"}, {})
    assert not registry.fans_out({"command": "everywhere"}, ArrayError("invalid_array", "x"))
    assert registry.fans_out({"command": "everywhere"}, {})
    assert registry.fans_out({"command": "everywhere", "payload": {"axes": {}}}, {})


def test_built_in_commands_are_ping_local_and_the_rest_everywhere():
    server.load_command_modules(server.BUILTIN_MODULES)
    assert {"ping", "devices", "mesh_grid"} <= set(server.COMMANDS)
    assert {"session_create", "session_info", "session_delete", "session_step"} <= set(
        server.COMMANDS
    )
    assert server.LOCAL >= {"ping"} and not server.LOCAL & {"devices", "mesh_grid"}
    assert not {n for n in server.COMMANDS if n.startswith("session_")} & server.LOCAL


# ------------------------------------------------------- the runtime process on its own


def _raw_frame(header: dict, body: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack(">I", len(raw)) + raw + body


def _raw_reply(sock: socket.socket) -> dict:
    (length,) = struct.unpack(">I", sock.recv(4, socket.MSG_WAITALL))
    header, total = channel.decode_header(sock.recv(length, socket.MSG_WAITALL))
    assert total == 0
    return header


class RawRuntime:
    """``python -m app.runtime`` on one end of a socket pair, no client, no test commands."""

    def __init__(self, settings):
        self.sock, child = socket.socketpair()
        self.sock.settimeout(60)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "app.runtime",
                f"--fd={child.fileno()}",
                f"--parent-pid={os.getpid()}",
                f"--settings-json={settings.model_dump_json(exclude={'api_token'})}",
            ],
            pass_fds=[child.fileno()],
            cwd=PROJECT_ROOT,
            env=runtime_environment(settings, os.environ),
            start_new_session=True,
        )
        child.close()

    def ask(self, header: dict, body: bytes = b"") -> dict:
        self.sock.sendall(_raw_frame(header, body))
        return _raw_reply(self.sock)

    def close(self) -> None:
        self.sock.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=20)


@pytest.fixture
def raw_runtime(settings_in):
    runtime = RawRuntime(settings_in())
    yield runtime
    runtime.close()


def test_runtime_checks_frames_itself_and_exits_0_on_eof(raw_runtime):
    """Frames the client would refuse, sent by hand; only the built-in commands."""
    spec = {"name": "x", "dtype": "object", "shape": [1], "nbytes": 8}
    reply = raw_runtime.ask({"id": 1, "command": "ping", "arrays": [spec]}, b"\0" * 8)
    assert reply["id"] == 1 and not reply["ok"]
    assert (reply["error"]["status"], reply["error"]["code"]) == (422, "unsupported_dtype")

    spec = {"name": "x", "dtype": "float32", "shape": [3], "nbytes": 8}
    reply = raw_runtime.ask({"id": 2, "command": "ping", "arrays": [spec]}, b"\0" * 8)
    assert reply["error"]["code"] == "invalid_array"

    reply = raw_runtime.ask({"id": 3, "command": "echo", "payload": {}})  # a test command
    assert (reply["error"]["status"], reply["error"]["code"]) == (400, "unknown_command")

    reply = raw_runtime.ask({"id": 4, "command": "session_info", "payload": {"id": "x"}})
    assert (reply["error"]["status"], reply["error"]["code"]) == (410, "session_lost")

    reply = raw_runtime.ask({"id": 5, "command": "ping"})
    assert reply["ok"] and reply["result"]["pid"] == raw_runtime.proc.pid

    raw_runtime.sock.close()
    assert raw_runtime.proc.wait(timeout=20) == 0


def test_runtime_exits_2_on_a_corrupt_stream(raw_runtime):
    assert raw_runtime.ask({"id": 1, "command": "ping"})["ok"]
    raw_runtime.sock.sendall(struct.pack(">I", 5) + b"nope!")
    assert raw_runtime.proc.wait(timeout=20) == 2
