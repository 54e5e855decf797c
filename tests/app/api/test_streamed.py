"""Large stored plans answered from their compressed form (app.api.streamed), in process:
the same bytes, tags and 304s as a plan built whole, gzip framed from the stored deflate
data, and an answer of many pieces."""

from __future__ import annotations

import gzip
import zlib

import pytest

from app.api import streamed
from app.api.http_cache import body_tag
from app.main import create_app
from app.storage import plans as stored_plans
from tests.helpers import StubRuntime, TestClient, make_settings

LARGE = {"axes": {"data": -1, "model": 2}, "num_devices": 8192, "name": "streamed"}
SMALL = {"axes": {"data": -1}, "num_devices": 8, "name": "small"}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    settings = make_settings(tmp_path_factory.mktemp("streamed"))
    with TestClient(create_app(settings, runtime=StubRuntime(ready=True))) as c:
        yield c


@pytest.fixture(scope="module")
def large(client):
    made = client.post("/v1/meshes", json=LARGE, headers={"Accept-Encoding": "identity"})
    assert made.status_code == 201, made.text
    return made


def test_a_large_plan_is_stored_compressed_and_read_back_byte_for_byte(client, large):
    plan_id = large.json()["id"]
    stored = client.portal.call(stored_plans.get_plan_stored, client.app.state.store, plan_id)
    assert isinstance(stored, bytes) and len(stored) < len(large.content) / 4
    # Many pieces: the answer is sent in several messages, not one.
    assert len(stored) > streamed.PIECE_BYTES
    got = client.get(f"/v1/meshes/{plan_id}", headers={"Accept-Encoding": "identity"})
    assert got.status_code == 200
    assert got.content == large.content
    assert got.headers["content-length"] == str(len(large.content))
    assert got.headers["etag"] == f'"{body_tag(large.content)}"'
    assert got.headers["content-type"] == "application/json"
    assert got.headers["cache-control"]  # the route's policy, added by the middleware
    assert "Accept-Encoding" in got.headers["vary"]
    assert "content-encoding" not in got.headers


def test_gzip_is_the_stored_deflate_data_framed_as_gzip(client, large):
    plan_id = large.json()["id"]
    got = client.get(f"/v1/meshes/{plan_id}", headers={"Accept-Encoding": "gzip"})
    assert got.status_code == 200 and got.headers["content-encoding"] == "gzip"
    assert got.headers["etag"] == f'"{body_tag(large.content)}.gz"'
    assert got.content == large.content  # httpx decoded it; the wire form is read next
    with client.stream(
        "GET", f"/v1/meshes/{plan_id}", headers={"Accept-Encoding": "gzip"}
    ) as stream:
        raw = b"".join(stream.iter_raw())
    assert raw[:2] == b"\x1f\x8b" and len(raw) == int(stream.headers["content-length"])
    assert gzip.decompress(raw) == large.content


@pytest.mark.parametrize("gz", [False, True])
def test_304_for_either_form_of_the_tag(client, large, gz):
    plan_id = large.json()["id"]
    tag = body_tag(large.content) + (".gz" if gz else "")
    for encoding in ("gzip", "identity"):
        got = client.get(
            f"/v1/meshes/{plan_id}",
            headers={"If-None-Match": f'"{tag}"', "Accept-Encoding": encoding},
        )
        assert got.status_code == 304 and got.content == b""
        assert got.headers["etag"].strip('"').removesuffix(".gz") == body_tag(large.content)
    stale = client.get(f"/v1/meshes/{plan_id}", headers={"If-None-Match": '"0123"'})
    assert stale.status_code == 200


def test_head_has_the_length_and_no_body(client, large):
    plan_id = large.json()["id"]
    got = client.head(f"/v1/meshes/{plan_id}", headers={"Accept-Encoding": "identity"})
    assert got.status_code == 200 and got.content == b""
    assert got.headers["content-length"] == str(len(large.content))


def test_small_plans_stay_text_and_are_tagged_by_the_cache_middleware(client):
    made = client.post("/v1/meshes", json=SMALL, headers={"Accept-Encoding": "identity"})
    plan_id = made.json()["id"]
    stored = client.portal.call(stored_plans.get_plan_stored, client.app.state.store, plan_id)
    assert isinstance(stored, str)
    got = client.get(f"/v1/meshes/{plan_id}", headers={"Accept-Encoding": "identity"})
    assert got.content == made.content and got.headers["etag"] == f'"{body_tag(made.content)}"'


def test_a_deleted_large_plan_is_404(client):
    made = client.post("/v1/meshes", json={**LARGE, "name": "gone"})
    plan_id = made.json()["id"]
    assert client.get(f"/v1/meshes/{plan_id}").status_code == 200  # facts remembered
    assert client.delete(f"/v1/meshes/{plan_id}").status_code == 204
    assert client.get(f"/v1/meshes/{plan_id}").status_code == 404


@pytest.mark.parametrize("size", [0, 1, streamed.PIECE_BYTES - 1, 5 * streamed.PIECE_BYTES + 7])
def test_body_facts_match_the_whole_body(size):
    body = bytes((i * 7919) % 251 for i in range(size))
    facts = streamed.body_facts(zlib.compress(body, 6))
    assert facts.length == len(body)
    assert facts.tag == body_tag(body)
    assert facts.crc32 == zlib.crc32(body)
