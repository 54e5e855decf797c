"""The dashboard's HTTP: pages and assets from the package, offline docs, and what the plan
page reads (plan summaries, layout scopes). ETag/304, gzip, Cache-Control and CORS are
``tests/app/api/test_http_cache.py``'s. In-process with a stand-in runtime (plans here are
abstract: no device work)."""

from __future__ import annotations

import re

import pytest

from app.main import create_app
from app.services.dashboard import asset_names
from tests.helpers import StubRuntime, TestClient, assert_problem, make_settings

ABSTRACT_PLAN = {
    "axes": {"data": -1, "model": 4},
    "num_devices": 1024,
    "batch_shape": [2048, 16],
    "name": "dash-plan",
}
PAGES = ["/", "/plans/m_x", "/jobs/some-job", "/sessions/s_x", "/devices"]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    settings = make_settings(
        tmp_path_factory.mktemp("dash"), cors_origins="https://grafana.example:3000"
    )
    with TestClient(create_app(settings, runtime=StubRuntime(ready=True))) as c:
        yield c


@pytest.fixture(scope="module")
def plan_id(client):
    answer = client.post("/v1/meshes", json=ABSTRACT_PLAN)
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.strip("/").split("/")[0] or "home")
def test_every_page_address_answers_the_dashboard(client, path):
    answer = client.get(path)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/html")
    assert answer.headers["cache-control"] == "no-cache"
    assert "default-src 'self'" in answer.headers["content-security-policy"]
    assert '<main id="view"' in answer.text
    assert "/dashboard/static/app.js?v=" in answer.text and "{{v:" not in answer.text


@pytest.mark.parametrize("path", ["/docs", "/redoc", *PAGES])
def test_html_references_only_local_assets(client, path):
    html = client.get(path).text
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert refs, html
    for ref in refs:
        assert ref.startswith("/") or ref.startswith("data:"), f"{path} loads {ref}"
        if ref.startswith("/dashboard/"):
            assert client.get(ref).status_code == 200, ref
    assert "cdn" not in html.lower()


def test_docs_serve_the_vendored_swagger_ui_and_redoc(client):
    assert "/dashboard/vendor/swagger-ui-5.32.0/swagger-ui-bundle.js" in client.get("/docs").text
    assert "/dashboard/vendor/redoc-2.5.2/redoc.standalone.js" in client.get("/redoc").text
    for name in ("swagger-ui-5.32.0/LICENSE", "redoc-2.5.2/LICENSE", "uplot-1.6.32/LICENSE"):
        assert "vendor/" + name in asset_names(), name
    # The charts are uPlot's, vendored and pinned: the page loads its script and style.
    page = client.get("/").text
    for name in ("uPlot.iife.min.js", "uPlot.min.css"):
        assert f"/dashboard/vendor/uplot-1.6.32/{name}" in page, name
    assert "(v1.6.32)" in client.get("/dashboard/vendor/uplot-1.6.32/uPlot.iife.min.js").text
    # The docs pages are not API operations.
    paths = client.get("/openapi.json").json()["paths"]
    assert not {"/", "/docs", "/redoc", "/devices"} & set(paths)


def test_assets_are_tagged_compressed_and_cached_for_a_year(client):
    answer = client.get("/dashboard/static/app.js", headers={"Accept-Encoding": "gzip"})
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/javascript")
    assert answer.headers["content-encoding"] == "gzip"
    assert answer.headers["cache-control"] == "public, max-age=31536000, immutable"
    tag = answer.headers["etag"]
    again = client.get(
        "/dashboard/static/app.js", headers={"Accept-Encoding": "gzip", "If-None-Match": tag}
    )
    assert again.status_code == 304 and again.content == b""
    plain = client.get("/dashboard/static/app.js", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers
    assert plain.content == answer.content  # httpx decoded the gzip one


@pytest.mark.parametrize("name", ["nope.js", "../settings.py", "static/../../main.py", "static/"])
def test_unknown_assets_are_404_problems(client, name):
    assert_problem(client.get(f"/dashboard/{name}"), 404, "not_found")


def test_plan_summary_view_leaves_out_the_devices(client, plan_id):
    full = client.get(f"/v1/meshes/{plan_id}").json()
    summary = client.get(f"/v1/meshes/{plan_id}?view=summary")
    assert summary.status_code == 200
    assert summary.json() == {k: v for k, v in full.items() if k not in ("shards", "device_grid")}
    assert len(summary.content) < len(client.get(f"/v1/meshes/{plan_id}").content) / 20
    assert_problem(client.get(f"/v1/meshes/{plan_id}?view=bogus"), 422, "validation_error")
    assert_problem(client.get("/v1/meshes/m_nope?view=summary"), 404, "mesh_not_found")


def test_layout_scopes_are_links_and_addresses(client, plan_id):
    overview = client.get(f"/v1/meshes/{plan_id}/layout.svg")
    assert overview.status_code == 200
    links = re.findall(r'<a href="([^"]+)"', overview.text)
    assert len(links) == 64 and links[0] == "?positions=0-15"  # 256 rows of data, 4 a block
    scoped = client.get(f"/v1/meshes/{plan_id}/layout.svg{links[0]}")
    assert scoped.status_code == 200 and scoped.headers["content-type"] == "image/svg+xml"
    assert "showing positions 0\u201315: 16 of 1,024 devices" in scoped.text
    assert scoped.headers["etag"] != overview.headers["etag"]
    again = client.get(
        f"/v1/meshes/{plan_id}/layout.svg{links[0]}",
        headers={"If-None-Match": scoped.headers["etag"]},
    )
    assert again.status_code == 304
    params = client.get("/openapi.json").json()["paths"]["/v1/meshes/{mesh_id}/layout.svg"]["get"]
    assert {p["name"] for p in params["parameters"]} >= {"slice", "host", "process", "positions"}


@pytest.mark.parametrize(
    ("query", "name"),
    [("slice=abc", "slice"), ("positions=9-3", "positions"), ("positions=5000", "positions"),
     ("host=1", "host"), ("positions=" + "1" * 30, "positions")],
    ids=["not-a-range", "backwards", "past-the-end", "no-hosts", "too-long"],
)  # fmt: skip
def test_bad_layout_scopes_are_422_problems(client, plan_id, query, name):
    answer = client.get(f"/v1/meshes/{plan_id}/layout.svg?{query}")
    assert_problem(answer, 422, "validation_error")
    assert answer.json()["errors"][0]["loc"][-1] == name


def test_the_page_hides_sign_in_until_the_server_asks_for_it_and_links_the_docs(client):
    html = client.get("/").text
    assert re.search(r'<form id="login"[^>]*\bhidden\b', html), "sign-in shows before it is needed"
    assert 'href="/docs"' in html and 'href="/redoc"' in html
