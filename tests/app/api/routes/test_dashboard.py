"""The dashboard's HTTP: pages and assets from the package, offline docs, ETag/304, gzip,
Cache-Control and CORS, and what the plan page reads (plan summaries, layout scopes).
In-process with a stand-in runtime (plans here are abstract: no device work)."""

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


def test_plan_etag_and_304(client, plan_id):
    first = client.get(f"/v1/meshes/{plan_id}", headers={"Accept-Encoding": "identity"})
    assert first.status_code == 200
    tag = first.headers["etag"]
    assert re.fullmatch(r'"[0-9a-f]{32}"', tag), tag
    assert first.headers["cache-control"] == "private, max-age=300"
    not_modified = client.get(f"/v1/meshes/{plan_id}", headers={"If-None-Match": tag})
    assert not_modified.status_code == 304 and not_modified.content == b""
    assert not_modified.headers["etag"].strip('"').removesuffix(".gz") == tag.strip('"')
    # A list of tags, a weak form of the tag and * all match; another tag does not.
    for header in (f'"nope", {tag}', f"W/{tag}", "*"):
        assert (
            client.get(f"/v1/meshes/{plan_id}", headers={"If-None-Match": header}).status_code
            == 304
        )
    assert client.get(f"/v1/meshes/{plan_id}", headers={"If-None-Match": '"x"'}).status_code == 200


def test_plan_gzip_is_negotiated(client, plan_id):
    plain = client.get(f"/v1/meshes/{plan_id}", headers={"Accept-Encoding": "identity"})
    zipped = client.get(f"/v1/meshes/{plan_id}", headers={"Accept-Encoding": "gzip, br"})
    assert "content-encoding" not in plain.headers
    assert zipped.headers["content-encoding"] == "gzip"
    assert "accept-encoding" in zipped.headers["vary"].lower()
    assert int(zipped.headers["content-length"]) < len(plain.content) / 4
    assert zipped.json() == plain.json()
    assert zipped.headers["etag"] == plain.headers["etag"][:-1] + '.gz"'
    refused = client.get(f"/v1/meshes/{plan_id}", headers={"Accept-Encoding": "gzip;q=0, *"})
    assert "content-encoding" not in refused.headers


def test_layout_svg_is_tagged_and_compressed(client, plan_id):
    first = client.get(f"/v1/meshes/{plan_id}/layout.svg", headers={"Accept-Encoding": "gzip"})
    assert first.status_code == 200 and first.headers["content-type"] == "image/svg+xml"
    assert first.headers["content-encoding"] == "gzip"
    assert first.text.lstrip().startswith("<")
    again = client.get(
        f"/v1/meshes/{plan_id}/layout.svg", headers={"If-None-Match": first.headers["etag"]}
    )
    assert again.status_code == 304


def test_job_history_tag_changes_with_a_push(client):
    body = {"metrics": {"loss": [1.0, 2.0]}, "step": 1}
    assert client.post("/v1/jobs/dash-job/metrics", json=body).status_code == 201
    first = client.get("/v1/jobs/dash-job/metrics")
    tag = first.headers["etag"]
    assert first.headers["cache-control"] == "no-cache"
    assert (
        client.get("/v1/jobs/dash-job/metrics", headers={"If-None-Match": tag}).status_code == 304
    )
    assert client.post("/v1/jobs/dash-job/metrics", json={**body, "step": 2}).status_code == 201
    changed = client.get("/v1/jobs/dash-job/metrics", headers={"If-None-Match": tag})
    assert changed.status_code == 200 and changed.headers["etag"] != tag


def test_small_answers_are_not_compressed(client):
    answer = client.post(
        "/v1/metrics/reduce",
        json={"metrics": {"loss": [1.0, 3.0]}},
        headers={"Accept-Encoding": "gzip"},
    )
    assert answer.status_code == 200
    assert "content-encoding" not in answer.headers
    live = client.get("/health/live", headers={"Accept-Encoding": "gzip"})
    assert "content-encoding" not in live.headers
    assert live.headers["cache-control"] == "no-store"


def test_large_answers_of_posts_are_compressed(client):
    metrics = {f"metric_{i}": [float(d) for d in range(64)] for i in range(10)}
    answer = client.post(
        "/v1/metrics/collect", json={"metrics": metrics}, headers={"Accept-Encoding": "gzip"}
    )
    assert answer.status_code == 200
    assert answer.headers["content-encoding"] == "gzip"
    assert len(answer.json()["devices"]) == 64  # httpx decoded it
    catalog = client.get("/v1/hardware", headers={"Accept-Encoding": "gzip"})
    assert catalog.headers["content-encoding"] == "gzip"
    assert catalog.headers["cache-control"] == "public, max-age=3600"


def test_cors_for_the_configured_origin_only(client, plan_id):
    origin = "https://grafana.example:3000"
    answer = client.get(f"/v1/meshes/{plan_id}", headers={"Origin": origin})
    assert answer.headers["access-control-allow-origin"] == origin
    assert "etag" in answer.headers["access-control-expose-headers"].lower()
    preflight = client.options(
        "/v1/meshes",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert preflight.status_code == 200
    assert "POST" in preflight.headers["access-control-allow-methods"]
    other = client.get(f"/v1/meshes/{plan_id}", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers


def test_no_cors_by_default(tmp_path):
    app = create_app(make_settings(tmp_path), runtime=StubRuntime(ready=True))
    with TestClient(app) as c:
        answer = c.get("/health/live", headers={"Origin": "https://grafana.example:3000"})
        assert "access-control-allow-origin" not in answer.headers


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
