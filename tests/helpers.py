"""Shared helpers and fixtures for the service tests.

tests/conftest.py loads the fixtures (``pytest_plugins = ["tests.helpers"]``):

- ``api``: one in-process app for the whole session (``with TestClient(app)``, so the
  lifespan runs and a real runtime process with 8 simulated CPU devices starts), ready.
- ``make_settings(tmp_path, **overrides)``, ``StubRuntime`` (a stand-in runtime for apps
  that test guards and error mapping without spawning JAX), ``assert_problem``.
- ``ServiceProcess``: the real ``datarax-serve`` on a free port, in its own process group,
  bounded by timeouts and killed by group.

Test modules import helpers from here before pytest loads it as a plugin, so pytest
cannot rewrite its asserts (they carry their own messages): PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from app.codecs.json_arrays import encode_json
from app.core.settings import Settings
from app.main import create_app

with warnings.catch_warnings():
    # starlette.testclient warns at import that it prefers httpx2 (not installed).
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

__all__ = ["TestClient"]

PROJECT_ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 120.0
PROBLEM_TYPE = "application/problem+json"


def make_settings(tmp_path: Path, **overrides: Any) -> Settings:
    """Test settings: 8 CPU devices, a database under ``tmp_path``."""
    values: dict[str, Any] = {
        "db": tmp_path / "datarax.sqlite",
        "cpu_devices": 8,
        "platforms": "cpu",
        "step_timeout_s": 60.0,
    }
    values.update(overrides)
    return Settings(**values)


def wait_ready(client: Any, timeout: float = READY_TIMEOUT_S) -> dict:
    """Polls ``/health/ready`` until 200; fails the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = client.get("/health/ready")
            if last.status_code == 200:
                return last.json()
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    body = None if last is None else last.text
    pytest.fail(f"service not ready within {timeout} s (last answer: {body})")


def assert_problem(response: httpx.Response, status: int, code: str) -> dict:
    """Checks an RFC 9457 answer: status, content type, the members and the ``code``."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith(PROBLEM_TYPE), response.headers
    body = response.json()
    assert body["code"] == code, body
    assert body["status"] == status, body
    for member in ("type", "title", "detail"):
        assert isinstance(body[member], str) and body[member], body
    assert "Traceback" not in body["detail"]
    return body


def npz_bytes(**arrays: Any) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


class StubRuntime:
    """A stand-in for ``RuntimeClient``: no process. ``ready`` and the answers are set by
    the test; ``call`` raises ``call_error`` when set."""

    def __init__(self, *, ready: bool = False, devices: int = 8, pid: int | None = 4242):
        self.ready = ready
        self.restarts = 0
        self.pid = pid
        self.call_error: BaseException | None = None
        self.devices = devices
        self.started = False

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False

    def device_info(self) -> dict | None:
        if not self.ready:
            return None
        return {
            "platform": "cpu",
            "process_count": 1,
            "process_index": 0,
            "devices": [
                {"id": i, "kind": "cpu", "platform": "cpu", "process_index": 0, "coords": None}
                for i in range(self.devices)
            ],
        }

    def memory_budget(self) -> dict | None:
        return {"host": 2**34, "device": None} if self.ready else None

    async def call(self, command: str, payload: dict | None = None, arrays=None, **options):
        del arrays, options
        if self.call_error is not None:
            raise self.call_error
        if command == "mesh_grid":
            axes = payload["axes"]
            n = int(np.prod(list(axes.values())))
            grid = np.arange(n).reshape(tuple(axes.values())).tolist()
            return {
                "axes": axes,
                "device_grid": grid,
                "process_index": {str(i): 0 for i in range(n)},
                "platform": "cpu",
            }, {}
        raise AssertionError(f"unexpected command {command}")


def _refuse_constant(name: str) -> Any:
    raise AssertionError(f"the answer holds {name}, which is not JSON (RFC 8259)")


def check_strict_json(response: httpx.Response) -> None:
    """Fails on a JSON answer that a strict parser refuses (bare NaN or Infinity, bad
    bytes): every answer of the clients built here passes through it."""
    media = response.headers.get("content-type", "").split(";")[0].strip()
    if media != "application/json" and not media.endswith("+json"):
        return
    response.read()
    if response.request.method == "HEAD" or not response.content:
        return
    try:
        json.loads(response.content, parse_constant=_refuse_constant)
    except (ValueError, AssertionError) as err:
        where = f"{response.request.method} {response.request.url.path}"
        raise AssertionError(f"{where} answered invalid JSON: {err}") from None


def strict_json(client: httpx.Client) -> httpx.Client:
    """``client``, with every answer checked by :func:`check_strict_json`."""
    hooks = client.event_hooks
    hooks["response"] = [*hooks.get("response", []), check_strict_json]
    client.event_hooks = hooks
    return client


@pytest.fixture(scope="session")
def api(tmp_path_factory: pytest.TempPathFactory):
    """The session's in-process service with a real runtime, ready."""
    settings = make_settings(tmp_path_factory.mktemp("api"))
    with strict_json(TestClient(create_app(settings))) as client:
        wait_ready(client)
        yield client


# --------------------------------------------------------------------- real server process


def free_port() -> int:
    """A port of 127.0.0.1 that the kernel hands to no other ``bind(0)`` for a minute.

    The server binds the port seconds later (after its imports), and several test
    processes (pytest-xdist workers) pick ports meanwhile: a port that is merely closed
    could be picked again. So one connection is made to it and closed from the accepting
    side first, which leaves that side in TIME_WAIT on the port: a later ``bind(0)`` and
    outgoing connections skip it, while the server, which binds with ``SO_REUSEADDR``
    (uvicorn does), takes it.
    """
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            accepted, _ = listener.accept()
            accepted.close()
    return port


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); read its state.
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return True


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to ``proc``'s process group (it was started with a session of its own);
    waits up to 30 s for ``proc``."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)


def serve_with_file_limit(nofile: int) -> list[str]:
    """``datarax-serve`` as a Python command line that first sets its file-descriptor
    limit (soft and hard) to ``nofile``, in the same process: no ``preexec_fn``, whose fork
    JAX's at-fork handler warns about in a test process that loaded JAX."""
    code = (
        "import resource, sys; "
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({nofile}, {nofile})); "
        "sys.argv[0] = 'datarax-serve'; from app.cli import cli; cli()"
    )
    return [sys.executable, "-c", code]


class ServiceProcess:
    """``datarax-serve`` in its own session (process group), on a free port.

    Use as a context manager; exit kills the server's process group and the runtime
    process it reported, whatever state they are in.
    """

    def __init__(
        self,
        db: Path,
        log_path: Path,
        *,
        env: dict[str, str] | None = None,
        unset: tuple[str, ...] = (),
        nofile: int | None = None,
    ):
        self.db = db
        self.nofile = nofile  # the server's file-descriptor limit (soft and hard), if given
        self.log_path = log_path
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.extra_env = env or {}
        self.unset = unset  # variables removed last: a start as a user's shell would do it
        self.proc: subprocess.Popen | None = None
        self.runtime_pids: set[int] = set()
        self._log = None

    def command(self) -> list[str]:
        script = Path(sys.executable).parent / "datarax-serve"
        prefix = [str(script)] if script.exists() else [sys.executable, "-m", "app.cli"]
        if self.nofile is not None:
            prefix = serve_with_file_limit(self.nofile)
        return [*prefix, "--host", "127.0.0.1", "--port", str(self.port), "--db", str(self.db)]

    def start(self) -> ServiceProcess:
        env = dict(os.environ)
        env.update(
            {
                "DATARAX_CPU_DEVICES": "8",
                "DATARAX_PLATFORMS": "cpu",
                "JAX_PLATFORMS": "cpu",
                "PYTHONPATH": str(PROJECT_ROOT),
                **self.extra_env,
            }
        )
        for name in self.unset:
            env.pop(name, None)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.command(),
            cwd=PROJECT_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def client(self, timeout: float = 30.0) -> httpx.Client:
        """A client of this server; every JSON answer is parsed strictly."""
        return strict_json(httpx.Client(base_url=self.base_url, timeout=timeout))

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout
        with self.client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                if self.proc is not None and self.proc.poll() is not None:
                    pytest.fail(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
                with contextlib.suppress(httpx.TransportError):
                    answer = client.get("/health/ready")
                    if answer.status_code == 200:
                        body = answer.json()
                        if body.get("runtime_pid"):
                            self.runtime_pids.add(int(body["runtime_pid"]))
                        return body
                time.sleep(0.2)
        pytest.fail(f"server not ready within {timeout} s:\n{self.log_tail()}")

    def wait_live(self, timeout: float = 60.0) -> None:
        """Until ``/health/live`` answers 200 (the HTTP side is up; the runtime may not be)."""
        deadline = time.monotonic() + timeout
        with self.client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.proc is not None and self.proc.poll() is not None:
                    pytest.fail(f"server exited:\n{self.log_tail()}")
                with contextlib.suppress(httpx.TransportError):
                    if client.get("/health/live").status_code == 200:
                        return
                time.sleep(0.1)
        pytest.fail(f"server not live within {timeout} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    def kill(self) -> None:
        """SIGKILL to the server's whole process group; waits for it."""
        if self.proc is not None:
            kill_group(self.proc)

    def stop(self) -> None:
        self.kill()
        for pid in self.runtime_pids:
            # The runtime has its own session and exits when its parent dies; make sure.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> ServiceProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def as_json(text: str) -> Any:
    return json.loads(text)


def to_jsonable(value: Any) -> Any:
    """What the service's JSON answer holds for ``value`` (numpy in, Python out)."""
    return orjson.loads(encode_json(value))
