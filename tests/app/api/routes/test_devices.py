"""``GET /v1/devices``: the runtime's devices."""

from __future__ import annotations


def test_devices(api):
    body = api.get("/v1/devices").json()
    assert body["platform"] == "cpu"
    assert body["process_count"] == 1 and body["process_index"] == 0
    assert [d["id"] for d in body["devices"]] == list(range(8))
    assert all(d["process_index"] == 0 and d["kind"] for d in body["devices"])
