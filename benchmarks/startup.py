"""How long the HTTP process takes to answer, beside what ``import jax`` alone costs.

Each start spawns the real service (``python -m app.cli``, the ``datarax-serve`` entry
point) on a free port with a fresh temporary database and the environment the service
runs with on a CPU host (``JAX_PLATFORMS=cpu``), and times from just before the spawn
until ``GET /health/live`` first answers 200 (the HTTP side is up; the runtime process
it starts may still be importing JAX). Side by side, in the same run, a fresh
interpreter times ``import jax`` alone: an HTTP process that imports JAX cannot answer
sooner than that. Medians of a few starts; every spawned process group is killed.

Run alone: ``python -m benchmarks.startup``; ``make bench`` runs it as ``startup``.
"""

from __future__ import annotations

import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.server import ROOT, free_port, spawn, stop

TARGET_S = 1.5
"""Issue 28: ``/health/live`` answers within 1.5 s of start."""

LIVE_TIMEOUT_S = 120.0
POLL_S = 0.005


def _live(port: int) -> bool:
    """One ``GET /health/live``; False while nothing listens or the answer is not 200."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/health/live")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def time_to_live() -> float:
    """Seconds from spawning the service until ``/health/live`` answers 200.

    Raises:
      RuntimeError: the service exited, or was not live within ``LIVE_TIMEOUT_S``.
    """
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "service.log"
        with log_path.open("wb") as log:
            start = time.perf_counter()
            proc = spawn(port, Path(tmp) / "startup.sqlite", {"JAX_PLATFORMS": "cpu"}, log)
            try:
                while not _live(port):
                    if proc.poll() is not None:
                        tail = log_path.read_text(errors="replace")[-2000:]
                        raise RuntimeError(f"the service exited with {proc.returncode}:\n{tail}")
                    if time.perf_counter() - start > LIVE_TIMEOUT_S:
                        raise RuntimeError(f"the service was not live within {LIVE_TIMEOUT_S} s")
                    time.sleep(POLL_S)
                return time.perf_counter() - start
            finally:
                stop(proc)


def import_jax_s() -> float:
    """Seconds ``import jax`` takes in a fresh interpreter (timed inside it)."""
    code = "import time; t = time.perf_counter(); import jax; print(time.perf_counter() - t)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return float(done.stdout.strip())


def run(starts: int = 5) -> dict[str, object]:
    """Alternates service starts and ``import jax`` runs (so both see the same load).

    Returns:
      ``live_s`` / ``import_jax_s`` (medians, seconds), every sample, their ratio, the
      target and whether the median meets it.
    """
    live, jax_import = [], []
    for _ in range(starts):
        live.append(time_to_live())
        jax_import.append(import_jax_s())
    live_s, jax_s = statistics.median(live), statistics.median(jax_import)
    return {
        "starts": starts,
        "live_s": round(live_s, 3),
        "import_jax_s": round(jax_s, 3),
        "live_over_import_jax": round(live_s / jax_s, 2),
        "live_samples_s": [round(x, 3) for x in live],
        "import_jax_samples_s": [round(x, 3) for x in jax_import],
        "target_s": TARGET_S,
        "met": live_s <= TARGET_S,
    }


if __name__ == "__main__":
    print(run())
