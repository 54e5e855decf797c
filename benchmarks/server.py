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

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(
    env: dict[str, str] | None = None, ready_timeout: float = 180.0
) -> Iterator[str]:
    """Yields the base URL of a fresh server; kills its process group on exit."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        full_env = {
            **os.environ,
            "DATARAX_DB": str(Path(tmp) / "bench.sqlite"),
            "DATARAX_CPU_DEVICES": "8",
            "DATARAX_PLATFORMS": "cpu",
            "DATARAX_MAX_BODY_MB": "256",
            **(env or {}),
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT,
            env=full_env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
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
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
