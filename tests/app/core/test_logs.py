"""One log format for the HTTP process, uvicorn and the runtime; the request id in all
three, against the real ``datarax-serve`` (and its real runtime process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import PROJECT_ROOT, ServiceProcess

SYNTH = {"seed": 0, "batch_size": 16}


def _records(text: str) -> list[dict]:
    """Every line the service wrote, parsed: a line that is not a JSON object fails."""
    records = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            pytest.fail(f"a log line that is not JSON: {line!r}")
        assert isinstance(record, dict), line
        for field in ("time", "level", "logger", "process", "pid", "message"):
            assert field in record, (field, record)
        records.append(record)
    return records


def test_json_lines_carry_the_request_id_in_app_and_runtime(tmp_path):
    log_path = tmp_path / "serve.log"
    rid = "trace-7f3a:step.1"
    with ServiceProcess(tmp_path / "db.sqlite", log_path) as server:
        server.wait_ready()
        with server.client(timeout=120.0) as client:
            plan = client.post("/v1/meshes", json={"axes": {"data": 8}}).json()
            created = client.post(
                f"/v1/meshes/{plan['id']}/sessions",
                json={"model": {"kind": "mlp", "features": [8, 16, 4]}},
                headers={"X-Request-ID": "create-1"},
            )
            assert created.status_code == 201, created.text
            assert created.headers["x-request-id"] == "create-1"
            sid = created.json()["id"]
            step = client.post(
                f"/v1/sessions/{sid}/steps",
                json={"steps": 2, "synthetic": SYNTH},
                headers={"X-Request-ID": rid},
            )
            assert step.status_code == 200, step.text
            assert step.headers["x-request-id"] == rid
        server.kill()  # every line is written before the file is read
        records = _records(log_path.read_text())

    def of(request_id: str) -> list[dict]:
        return [r for r in records if r.get("request_id") == request_id]

    step_lines = of(rid)
    assert {r["process"] for r in step_lines} == {"http", "runtime"}, step_lines
    access = [r for r in step_lines if r["logger"] == "uvicorn.access"]
    assert len(access) == 1 and access[0]["status"] == 200, access
    compiles = [r for r in step_lines if "compile_s" in r]
    assert len(compiles) == 1 and compiles[0]["compile_s"] > 0, step_lines
    assert compiles[0]["session"] == sid and compiles[0]["pid"] != access[0]["pid"]

    create_lines = of("create-1")
    assert {r["process"] for r in create_lines} == {"http", "runtime"}, create_lines
    assert any(r["process"] == "runtime" and r.get("session") == sid for r in create_lines)
    assert any(r["process"] == "http" and sid in r["message"] for r in create_lines)
    # Lines outside a request (start-up, the runtime's start) carry no id.
    assert any("runtime process" in r["message"] and "request_id" not in r for r in records)


TEXT_SCRIPT = """
import logging
from app.core.logs import REQUEST_ID, configure_logging
configure_logging("text", "info", process_label="runtime")
REQUEST_ID.set("abc-1")
logging.getLogger("datarax.app").info("hello %s", "there")
"""


def test_text_format_for_people():
    result = subprocess.run(
        [sys.executable, "-c", TEXT_SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=PROJECT_ROOT,
        check=True,
    )
    line = result.stderr.strip().splitlines()[-1]
    assert line.endswith("INFO datarax.app [runtime abc-1] hello there"), line
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)
