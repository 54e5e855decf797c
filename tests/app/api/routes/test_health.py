"""Liveness, readiness and the Prometheus endpoint."""

from __future__ import annotations


def test_live_and_ready(api):
    assert api.get("/health/live").json() == {"status": "ok"}
    ready = api.get("/health/ready")
    assert ready.status_code == 200
    body = ready.json()
    assert body["status"] == "ready" and body["store"] == "ok"
    assert isinstance(body["runtime_pid"], int)


def test_prometheus_negotiates_openmetrics(api):
    response = api.get(
        "/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.rstrip().endswith("# EOF")
