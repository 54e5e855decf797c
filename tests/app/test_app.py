"""Health, devices, Prometheus and the OpenAPI document."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import assert_problem


def test_live_and_ready(api):
    assert api.get("/health/live").json() == {"status": "ok"}
    ready = api.get("/health/ready")
    assert ready.status_code == 200
    body = ready.json()
    assert body["status"] == "ready" and body["store"] == "ok"
    assert isinstance(body["runtime_pid"], int)


def test_devices(api):
    body = api.get("/v1/devices").json()
    assert body["platform"] == "cpu"
    assert body["process_count"] == 1 and body["process_index"] == 0
    assert [d["id"] for d in body["devices"]] == list(range(8))
    assert all(d["process_index"] == 0 and d["kind"] for d in body["devices"])


def _sample(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        match = re.match(r"^(\w+)(\{.*\})? (\S+)$", line)
        if not match or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(match.group(3))
    return None


def test_prometheus_counts_by_route_template(api):
    plan = api.post("/v1/meshes", json={"axes": {"data": 2}, "num_devices": 2}).json()
    api.get(f"/v1/meshes/{plan['id']}")
    api.get("/v1/meshes/m_missing")
    api.get("/no/such/path")
    response = api.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    route = "/v1/meshes/{mesh_id}"
    assert _sample(text, "datarax_http_requests_total", route=route, status="200") >= 1
    assert _sample(text, "datarax_http_requests_total", route=route, status="404") >= 1
    assert _sample(text, "datarax_http_requests_total", route="<unmatched>", status="404") >= 1
    assert plan["id"] not in text  # raw paths never become labels
    assert _sample(text, "datarax_http_request_duration_seconds_count", route=route) >= 1
    assert _sample(text, "datarax_mesh_plans_created_total", kind="abstract") >= 1
    # The shared app's runtime may have been restarted by an earlier test on purpose.
    assert _sample(text, "datarax_runtime_restarts_total") == api.app.state.runtime.restarts
    assert _sample(text, "datarax_runtime_ready") == 1
    assert _sample(text, "process_resident_memory_bytes") > 0  # prometheus-client's own


def test_prometheus_negotiates_openmetrics(api):
    response = api.get(
        "/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.rstrip().endswith("# EOF")


def test_openapi_is_complete(api):
    doc = api.get("/openapi.json").json()
    paths = doc["paths"]
    expected = {
        "/health/live": {"get"},
        "/health/ready": {"get"},
        "/v1/devices": {"get"},
        "/v1/meshes": {"get", "post"},
        "/v1/meshes/{mesh_id}": {"get", "delete"},
        "/v1/meshes/{mesh_id}/layout.svg": {"get"},
        "/v1/metrics/reduce": {"post"},
        "/v1/metrics/collect": {"post"},
        "/v1/jobs/{job}/metrics": {"get", "post"},
        "/v1/meshes/{mesh_id}/sessions": {"post"},
        "/v1/sessions/{session_id}": {"get", "delete"},
        "/v1/sessions/{session_id}/steps": {"post"},
        "/metrics": {"get"},
    }
    for path, methods in expected.items():
        assert methods <= set(paths[path]), path
    schemas = doc["components"]["schemas"]
    for name in (
        "Problem",
        "ValidationProblem",
        "MeshPlan",
        "MeshPlanRequest",
        "MetricsReduceRequest",
    ):
        assert name in schemas, name

    post_plan = paths["/v1/meshes"]["post"]
    assert post_plan["responses"]["201"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/MeshPlan"
    )
    assert "Location" in post_plan["responses"]["201"]["headers"]
    problem = post_plan["responses"]["422"]["content"]["application/problem+json"]["schema"]
    assert problem["$ref"].endswith("/ValidationProblem")
    examples = post_plan["requestBody"]["content"]["application/json"]["examples"]
    assert examples["live"]["value"]["axes"] == {"data": -1, "model": 4}

    reduce_body = paths["/v1/metrics/reduce"]["post"]["requestBody"]["content"]
    assert {"application/json", "application/x-npz"} <= set(reduce_body)
    assert reduce_body["application/json"]["example"]["reduce"]["step"] == "max"
    # No token set (this app): the document declares no auth, as the server enforces none
    # (the token case: tests/app/test_hostile_inputs.py).
    assert "securitySchemes" not in doc["components"]
    assert "security" not in post_plan and "401" not in post_plan["responses"]

    # Every $ref resolves.
    refs = set(
        re.findall(r'"\$ref": ?"#/components/schemas/([^"]+)"', api.get("/openapi.json").text)
    )
    assert refs <= set(schemas), refs - set(schemas)


def test_not_found_is_a_problem(api):
    assert_problem(api.get("/v2/anything"), 404, "not_found")


NO_BACKEND_SCRIPT = r"""
import io, sys, warnings
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]
warnings.simplefilter("ignore")
import numpy as np
from tests.helpers import StubRuntime, TestClient, make_settings
from pathlib import Path
from app.main import create_app
from jax._src import xla_bridge

app = create_app(make_settings(Path(sys.argv[2])), runtime=StubRuntime(ready=True))
with TestClient(app) as client:
    plan = client.post("/v1/meshes", json={"axes": {"data": 2, "model": 4}, "batch_shape": [8, 2],
                                           "model": {"kind": "mlp", "features": [8, 8]}})
    assert plan.status_code == 201, plan.text
    abstract = client.post("/v1/meshes", json={"axes": {"data": -1}, "num_devices": 64})
    assert client.get(abstract.headers["location"] + "/layout.svg").status_code == 200
    body = {"metrics": {"x": [[1, 2], [3, 4]]}, "reduce": {"x": "sum"}}
    assert client.post("/v1/metrics/reduce", json=body).status_code == 200
    assert client.post("/v1/metrics/collect", json=body).status_code == 200
    buffer = io.BytesIO(); np.savez(buffer, x=np.ones(3))
    npz = client.post("/v1/jobs/j/metrics?step=1", content=buffer.getvalue(),
                      headers={"content-type": "application/x-npz"})
    assert npz.status_code == 201, npz.text
print("backends:", sorted(xla_bridge._backends))
"""


def test_http_process_never_starts_a_jax_backend(tmp_path):
    """Plans, reductions, collection, SVGs and npz bodies run without a JAX backend (run in
    a fresh interpreter: this test process has backends for the layout checks)."""
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", NO_BACKEND_SCRIPT, str(root), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("backends: []"), result.stdout
