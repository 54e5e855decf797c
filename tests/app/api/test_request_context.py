"""``X-Request-ID``: kept when safe, generated otherwise, echoed on every answer."""

from __future__ import annotations

import re

import pytest

from app.api.request_context import MAX_REQUEST_ID, request_id_of
from app.main import create_app
from tests.helpers import StubRuntime, TestClient, assert_problem, make_settings

GENERATED = re.compile(r"[0-9a-f]{32}")


@pytest.mark.parametrize(
    "given",
    ["0f8fad5b-d9cb-469f-a165-70867728950e", "01JF3Q2W", "a.b_c:d-e", "x" * MAX_REQUEST_ID],
    ids=["uuid", "ulid-like", "punctuation", "longest"],
)
def test_safe_ids_are_kept(given):
    assert request_id_of(given.encode()) == given


@pytest.mark.parametrize(
    "given",
    [b"", b"x" * (MAX_REQUEST_ID + 1), b"a b", b"a\nfake log line", b'a"}', "é".encode()],
    ids=["empty", "too-long", "space", "newline", "json-breaking", "non-ascii"],
)
def test_unsafe_or_missing_ids_are_replaced(given):
    assert GENERATED.fullmatch(request_id_of(given))
    assert GENERATED.fullmatch(request_id_of(None))
    assert request_id_of(None) != request_id_of(None)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    settings = make_settings(tmp_path_factory.mktemp("rid"), api_token="s3cret")
    with TestClient(create_app(settings, runtime=StubRuntime(ready=True))) as c:
        yield c


def test_answers_echo_the_given_id(client):
    r = client.get("/health/live", headers={"X-Request-ID": "job-42.step-7"})
    assert r.status_code == 200
    assert r.headers.get_list("x-request-id") == ["job-42.step-7"]


def test_answers_carry_a_generated_id_without_a_usable_one(client):
    first = client.get("/health/live").headers["x-request-id"]
    second = client.get("/health/live", headers={"X-Request-ID": "bad id"}).headers["x-request-id"]
    assert GENERATED.fullmatch(first) and GENERATED.fullmatch(second) and first != second


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("get", "/v1/meshes/m_nope", 404, "mesh_not_found"),
        ("post", "/v1/meshes", 401, "unauthorized"),
    ],
    ids=["not-found", "unauthorized"],
)
def test_problem_answers_carry_it_too(client, method, path, status, code):
    r = client.request(method, path, headers={"X-Request-ID": "err-1"}, json={})
    assert_problem(r, status, code)
    assert r.headers["x-request-id"] == "err-1"
