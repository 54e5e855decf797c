"""Body media types and answer negotiation of the metric routes: the parse caches keep
only short values, and a long ``Accept`` is read only as far as its first KiB."""

from __future__ import annotations

import pytest

from app.api import http_cache, routing
from app.main import create_app
from tests.helpers import StubRuntime, TestClient, make_settings

LONG = "z" * (http_cache.MAX_CACHED_HEADER + 1)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    settings = make_settings(tmp_path_factory.mktemp("routing"), max_header_kb=8, max_headers=20)
    with TestClient(create_app(settings, runtime=StubRuntime(ready=True))) as client:
        yield client


def test_media_type_and_accept_caches_keep_only_short_values(service):
    routing._parse_media_type_cached.cache_clear()
    routing._prefers_npz_cached.cache_clear()
    for i in range(5):
        answer = service.post(
            "/v1/metrics/reduce",
            content=b'{"metrics": {"loss": [1.0, 2.0]}}',
            headers={
                "content-type": f"application/json; x={i}{LONG}",
                "accept": f"application/json, text/x-{i}{LONG}",
            },
        )
        assert answer.status_code == 200, answer.text
    assert routing._parse_media_type_cached.cache_info().currsize == 0
    assert routing._prefers_npz_cached.cache_info().currsize == 0
    long_npz = "application/x-npz, " + LONG
    assert routing._prefers_npz(long_npz) is True  # the uncached parse answers alike


def test_long_accept_reads_its_first_kib(service):
    body = b'{"metrics": {"loss": [1.0, 2.0]}}'
    headers = {"content-type": "application/json"}
    for accept, npz in [
        ("application/x-npz, " + "t/x," * 1500, True),
        ("t/x," * 1500 + "application/x-npz", False),
        ("," * 7000, False),
    ]:
        answer = service.post(
            "/v1/metrics/reduce", content=body, headers={**headers, "accept": accept}
        )
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"].startswith(
            "application/x-npz" if npz else "application/json"
        ), accept[:40]
