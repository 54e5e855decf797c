"""ETags and 304s, gzip, Cache-Control and CORS on the app as ``create_app`` builds it
(in-process, a stand-in runtime, abstract plans); the parse caches keep only short values,
and long ``If-None-Match`` and ``Accept-Encoding`` headers are read only as far as their
bounds."""

from __future__ import annotations

import re

import pytest

from app.api import http_cache
from app.main import create_app
from tests.helpers import StubRuntime, TestClient, make_settings

ORIGIN = "https://grafana.example:3000"
ABSTRACT_PLAN = {
    "axes": {"data": -1, "model": 4},
    "num_devices": 1024,
    "batch_shape": [2048, 16],
    "name": "cache-plan",
}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    settings = make_settings(tmp_path_factory.mktemp("cache"), cors_origins=ORIGIN)
    with TestClient(create_app(settings, runtime=StubRuntime(ready=True))) as c:
        yield c


@pytest.fixture(scope="module")
def plan_id(client):
    answer = client.post("/v1/meshes", json=ABSTRACT_PLAN)
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


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


# --------------------------------------------------------------------- parse caches


LONG = "z" * (http_cache.MAX_CACHED_HEADER + 1)


def test_accept_encoding_cache_keeps_only_short_values():
    cache = http_cache._accepts_gzip_cached
    cache.cache_clear()
    assert http_cache.accepts_gzip(b"gzip, " + LONG.encode()) is True
    assert http_cache.accepts_gzip(b"br, " + LONG.encode()) is False
    assert cache.cache_info().currsize == 0
    assert http_cache.accepts_gzip(b"gzip, br") is True
    assert http_cache.accepts_gzip(b"gzip;q=0, *") is False
    assert cache.cache_info().currsize == 2


@pytest.mark.parametrize(
    ("header", "matches"),
    [
        (b'"abc"', True),
        (b'W/"abc.gz"', True),
        (b"*", True),
        (b'"x", "abc"', True),
        (b'"x"', False),
        (b'"x", ' * 1000 + b'"abc"', False),  # past MAX_IF_NONE_MATCH: names nothing
        (b"", False),
    ],
    ids=["exact", "weak-gz", "star", "second", "other", "too-long", "empty"],
)
def test_if_none_match_is_bounded(header, matches):
    assert http_cache.etag_matches(header, "abc") is matches


@pytest.mark.parametrize(
    ("value", "gzip"),
    [
        (b"gzip, " + b"x" * 5000, True),  # the leading item counts
        (b"br, " + b"x" * 5000 + b", gzip", False),  # past the first KiB: not read
        (b"," * 65_000, False),  # a 64 KiB list of empty items
        (b" ," * 30_000 + b"gzip", False),
        (b"gzip;q=0.5," * 3000, True),
        (b"gzip" + b";q=1" * 16_000, False),  # one item longer than a KiB: nothing
    ],
    ids=["gzip-first", "gzip-late", "commas", "spaces", "repeated", "one-long-item"],
)
def test_long_accept_encoding_reads_its_first_kib(value, gzip):
    assert http_cache.accepts_gzip(value) is gzip
    part = http_cache.negotiated_part(value)
    assert len(part) <= http_cache.MAX_NEGOTIATED and value.startswith(part)
