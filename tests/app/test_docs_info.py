"""``/openapi.json`` (and so ``/docs``) names the package's own version and links the
dashboard."""

from __future__ import annotations

from fastapi.testclient import TestClient

from app.core.version import versions
from app.main import create_app
from tests.helpers import StubRuntime, make_settings


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
