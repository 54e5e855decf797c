"""Every answer counted by route template into the service's Prometheus metrics."""

from __future__ import annotations

import re

import pytest
from prometheus_client import generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from app.api.request_metrics import RequestMetricsMiddleware
from app.core.telemetry import UNMATCHED_ROUTE, Telemetry


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


def _item(request: Request) -> PlainTextResponse:
    return PlainTextResponse(request.path_params["item"])


def _broken(_request: Request) -> PlainTextResponse:
    raise RuntimeError("boom")


@pytest.fixture
def counted() -> tuple[TestClient, Telemetry]:
    """A bare Starlette app behind the middleware, counting into its own registry."""
    telemetry = Telemetry()
    app = Starlette(routes=[Route("/items/{item}", _item), Route("/broken", _broken)])
    wrapped = RequestMetricsMiddleware(app, telemetry)
    return TestClient(wrapped, raise_server_exceptions=False), telemetry


def test_answers_are_counted_by_template_and_status(counted):
    client, telemetry = counted
    assert client.get("/items/a").text == "a"
    client.get("/items/b")
    client.post("/items/c")  # 405: the route matched, the method did not
    client.get("/nowhere")
    text = generate_latest(telemetry.registry).decode()
    route = "/items/{item}"
    assert _sample(text, "datarax_http_requests_total", route=route, status="200") == 2
    assert _sample(text, "datarax_http_requests_total", route=route, status="405") == 1
    assert _sample(text, "datarax_http_requests_total", route=UNMATCHED_ROUTE, status="404") == 1
    latency = "datarax_http_request_duration_seconds_count"
    assert _sample(text, latency, route=route, method="GET") == 2
    assert _sample(text, latency, route=route, method="POST") == 1
    assert "/items/a" not in text


def test_an_exception_in_the_app_counts_as_500(counted):
    client, telemetry = counted
    assert client.get("/broken").status_code == 500
    text = generate_latest(telemetry.registry).decode()
    assert _sample(text, "datarax_http_requests_total", route="/broken", status="500") == 1
