"""The real ``datarax-serve`` process: durability across kill -9, runtime crash recovery.

Each test starts the server on a free port with a temporary database, in its own process
group, and kills the group (and the runtime it reported) in a finalizer.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import time

import httpx
import pytest

from tests.helpers import ServiceProcess, assert_problem, pid_alive

pytestmark = pytest.mark.timeout(240)

RECOVERY_TIMEOUT_S = 90.0


@pytest.fixture
def server(tmp_path):
    with ServiceProcess(tmp_path / "datarax.sqlite", tmp_path / "server.log") as service:
        service.wait_ready()
        yield service


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} missing from /metrics"
    return float(match.group(1))


def test_acknowledged_writes_survive_kill_9(tmp_path):
    db = tmp_path / "datarax.sqlite"
    acknowledged_plans: dict[str, bytes] = {}
    acknowledged_points: dict[int, dict] = {}
    with ServiceProcess(db, tmp_path / "first.log") as first:
        first.wait_ready()
        with first.client() as client:
            for i in range(5):
                response = client.post(
                    "/v1/meshes",
                    json={"axes": {"data": -1, "model": 2}, "num_devices": 8, "name": f"p{i}"},
                )
                assert response.status_code == 201, response.text
                acknowledged_plans[response.json()["id"]] = response.content
            live = client.post("/v1/meshes", json={"axes": {"data": 4}, "batch_shape": [8]})
            assert live.status_code == 201, live.text
            acknowledged_plans[live.json()["id"]] = live.content
            for step in range(20):
                response = client.post(
                    "/v1/jobs/durable/metrics",
                    json={"metrics": {"loss": [step, step + 2.0]}, "step": step},
                )
                assert response.status_code == 201, response.text
                acknowledged_points[step] = response.json()["reduced"]
        first.kill()  # SIGKILL right after the last acknowledgement
        assert first.proc.returncode == -signal.SIGKILL

    with ServiceProcess(db, tmp_path / "second.log") as second:
        second.wait_ready()
        with second.client() as client:
            for plan_id, body in acknowledged_plans.items():
                response = client.get(f"/v1/meshes/{plan_id}")
                assert response.status_code == 200, plan_id
                assert response.content == body
            assert client.get("/v1/meshes").json()["total"] == len(acknowledged_plans)
            points = client.get("/v1/jobs/durable/metrics").json()["points"]
            assert {p["step"]: p["reduced"] for p in points} == acknowledged_points


def test_runtime_kill_9_is_survived(server):
    with server.client() as client:
        ready = client.get("/health/ready").json()
        old_pid = ready["runtime_pid"]
        assert old_pid and pid_alive(old_pid)
        job = {"metrics": {"loss": [1.0, 3.0]}, "step": 1}
        assert client.post("/v1/jobs/crash/metrics", json=job).status_code == 201

        os.kill(old_pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pid_alive(old_pid) and time.monotonic() < deadline:
            time.sleep(0.05)

        # Device requests: 503 worker_lost while the runtime is down (or already back).
        devices = client.get("/v1/devices")
        if devices.status_code != 200:
            assert_problem(devices, 503, "worker_lost")
        live = client.post("/v1/meshes", json={"axes": {"data": 2}})
        if live.status_code != 201:
            assert_problem(live, 503, "worker_lost")
        # Everything that needs no device keeps working meanwhile.
        abstract = client.post("/v1/meshes", json={"axes": {"data": -1}, "num_devices": 1024})
        assert abstract.status_code == 201
        reduced = client.post("/v1/metrics/reduce", json={"metrics": {"x": [1, 2]}})
        assert reduced.json()["reduced"] == {"x": 1.5}
        assert client.post("/v1/jobs/crash/metrics", json={**job, "step": 2}).status_code == 201
        assert len(client.get("/v1/jobs/crash/metrics").json()["points"]) == 2
        assert client.get("/health/live").status_code == 200

        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while True:
            ready = client.get("/health/ready")
            if ready.status_code == 200:
                break
            assert_problem(ready, 503, "worker_lost")
            assert time.monotonic() < deadline, "runtime did not come back"
            time.sleep(0.2)
        new_pid = ready.json()["runtime_pid"]
        server.runtime_pids.add(new_pid)
        assert new_pid != old_pid
        assert client.get("/v1/devices").status_code == 200
        assert client.post("/v1/meshes", json={"axes": {"data": 2}}).status_code == 201
        assert _metric(client.get("/metrics").text, "datarax_runtime_restarts_total") >= 1


def test_big_abstract_plan_and_openapi(server):
    with server.client() as client:
        body = {
            "axes": {"data": -1, "model": 16},
            "batch_shape": [65536, 512],
            "num_devices": 65536,
        }
        response = client.post("/v1/meshes", json=body)
        assert response.status_code == 201
        assert response.headers["location"].startswith("/v1/meshes/m_")
        assert len(response.json()["shards"]) == 65536
        assert client.get("/openapi.json").json()["info"]["title"]


def test_declared_oversized_body_is_refused_before_it_is_sent(server):
    """A Content-Length above the limit gets 413 without the server reading a byte."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/metrics/reduce HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 10000000000\r\n\r\n"
        )
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert b"application/problem+json" in head
    assert b'"code":"payload_too_large"' in payload


def test_client_errors_from_a_real_server(server):
    with server.client() as client:
        assert_problem(client.get("/v1/meshes/m_missing"), 404, "mesh_not_found")
        bad = client.post("/v1/meshes", content=b"{", headers={"content-type": "application/json"})
        assert_problem(bad, 422, "invalid_json")
        with pytest.raises(httpx.HTTPStatusError):
            client.get("/nope").raise_for_status()
