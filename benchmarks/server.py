"""Starts the real ``datarax-serve`` on a free port with a temporary database."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(
    port: int, db: Path, env: dict[str, str] | None = None, stdout: Any = subprocess.DEVNULL
) -> subprocess.Popen[bytes]:
    """``datarax-serve`` on ``127.0.0.1:port`` over the database ``db``, 8 simulated CPU
    devices, in its own process group (stop it with :func:`stop`)."""
    full_env = {
        **os.environ,
        "DATARAX_DB": str(db),
        "DATARAX_CPU_DEVICES": "8",
        "DATARAX_PLATFORMS": "cpu",
        **(env or {}),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        env=full_env,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.STDOUT if stdout is not subprocess.DEVNULL else subprocess.DEVNULL,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM to the service's process group (it and its runtime), then SIGKILL."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout)


@contextlib.contextmanager
def running_server(
    env: dict[str, str] | None = None, ready_timeout: float = 180.0
) -> Iterator[str]:
    """Yields the base URL of a fresh server; kills its process group on exit."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        proc = spawn(
            port, Path(tmp) / "bench.sqlite", {"DATARAX_MAX_BODY_MB": "256", **(env or {})}
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + ready_timeout
            while True:
                try:
                    if httpx.get(f"{base}/health/ready", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("benchmark server did not become ready")
                time.sleep(0.2)
            yield base
        finally:
            stop(proc, timeout=10)
