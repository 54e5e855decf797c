"""The app that create_app builds: its OpenAPI info (the package's version, a link to the
dashboard), and an HTTP process that never starts a JAX backend."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fastapi.testclient import TestClient

from app.core.version import versions
from app.main import create_app
from tests.helpers import StubRuntime, make_settings

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


def test_openapi_names_the_package_version_and_links_the_dashboard(tmp_path):
    app = create_app(make_settings(tmp_path), runtime=StubRuntime(ready=True))
    with TestClient(app) as client:
        info = client.get("/openapi.json").json()["info"]
        docs = client.get("/docs")
    installed = versions()["version"]
    assert installed != "not installed"
    assert info["version"] == installed, info  # 0.1.0 today, never a hard-coded 1.0.0
    assert "[dashboard](/)" in info["description"]
    assert docs.status_code == 200, docs.text
