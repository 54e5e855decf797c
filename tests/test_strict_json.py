"""The suite's clients (``tests.helpers``) parse every JSON answer strictly: a bare NaN or
Infinity, which Python's json module accepts by default, fails the request's test."""

from __future__ import annotations

import httpx
import pytest

from tests.helpers import strict_json


def _client(body: bytes, media: str = "application/json") -> httpx.Client:
    def answer(_: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": media})

    return strict_json(httpx.Client(transport=httpx.MockTransport(answer), base_url="http://t"))


@pytest.mark.parametrize(
    "body",
    [b'{"losses":[NaN]}', b'{"last_loss":Infinity}', b'{"x":-Infinity}', b"{"],
    ids=["nan", "infinity", "minus-infinity", "truncated"],
)
@pytest.mark.parametrize("media", ["application/json", "application/problem+json"])
def test_invalid_json_answers_fail(body, media):
    with _client(body, media) as client, pytest.raises(AssertionError, match="invalid JSON"):
        client.get("/v1/sessions/s")


def test_valid_json_and_other_media_pass():
    with _client(b'{"losses":[null,1.5]}') as client:
        assert client.get("/").json() == {"losses": [None, 1.5]}
    with _client(b"NaN", "text/plain") as client:
        assert client.get("/").text == "NaN"
