"""The source files of this repository one request runs through: a hardware plan with a
named model (``POST /v1/meshes``) and a job push (``POST /v1/jobs/{job}/metrics``), on
the in-process service, each after one warm-up request of its kind.

Run: ``python -m benchmarks.request_trace`` (prints each request's files, ``app/`` and
``datarax/`` only). A profile hook on every thread records the files whose functions are
called; what a request imports lazily on its first run is left out by the warm-up.
"""

from __future__ import annotations

import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from app.main import create_app
from tests.helpers import make_settings, wait_ready

ROOT = Path(__file__).resolve().parents[1]

PLAN = {
    "hardware": "tpu-v5e",
    "topology": "16x16",
    "slices": 2,
    "ici": {"data": 1, "fsdp": 16, "tensor": 16},
    "dcn": {"data": 2},
    "batch_shape": [512, 2048],
    "model": {"name": "llama3.1-8b"},
}
PUSH = {"step": 1, "metrics": {"loss": [1.0, 2.0]}}


def traced_files(client: TestClient, path: str, body: dict[str, Any]) -> list[str]:
    """The repository's ``app/`` and ``datarax/`` files one POST of ``body`` calls into."""
    seen: set[str] = set()
    roots = (str(ROOT / "app"), str(ROOT / "datarax"))

    def profile(frame: Any, _event: str, _arg: Any) -> None:
        name = frame.f_code.co_filename
        if name.startswith(roots):
            seen.add(name)

    threading.setprofile_all_threads(profile)
    try:
        answer = client.post(path, json=body)
    finally:
        threading.setprofile_all_threads(None)
    answer.raise_for_status()
    return sorted(str(Path(name).relative_to(ROOT)) for name in seen)


def main() -> None:
    with TestClient(create_app(make_settings(Path(tempfile.mkdtemp())))) as client:
        wait_ready(client)
        for what, path, body in (
            ("hardware plan", "/v1/meshes", PLAN),
            ("job push", "/v1/jobs/trace-job/metrics", PUSH),
        ):
            client.post(path, json={**body, "step": 0} if "step" in body else body)
            files = traced_files(client, path, body)
            print(f"{what}: {len(files)} files")
            for name in files:
                print(f"  {name}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
