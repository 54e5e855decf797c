"""Resource caps on training sessions, against the real server: at most
``DATARAX_MAX_SESSIONS`` live (429 ``too_many_sessions``), idle ones freed after
``DATARAX_SESSION_IDLE_S`` (410 ``session_expired``), the memory of deleted ones handed back
to the OS, and the paginated session lists (read from the store)."""

from __future__ import annotations

import time

import psutil
import pytest

from tests.helpers import ServiceProcess, assert_problem

MAX_SESSIONS = 2
IDLE_S = 3.0
SMALL = {"model": {"kind": "mlp", "features": [16, 64, 8]}}
# ~5.3 M parameters, replicated on 8 devices: a few hundred MiB per session after a step.
LARGE = {"model": {"kind": "mlp", "features": [512, 2048, 2048, 512]}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("caps")
    env = {"DATARAX_MAX_SESSIONS": str(MAX_SESSIONS), "DATARAX_SESSION_IDLE_S": str(IDLE_S)}
    with ServiceProcess(tmp / "datarax.sqlite", tmp / "server.log", env=env) as service:
        ready = service.wait_ready()
        with service.client(timeout=120) as client:
            plan = client.post("/v1/meshes", json={"axes": {"data": 8}})
            assert plan.status_code == 201, plan.text
            yield client, plan.json()["id"], int(ready["runtime_pid"])


def _create(client, plan_id, body=SMALL):
    return client.post(f"/v1/meshes/{plan_id}/sessions", json=body)


def _delete_all(client):
    for item in client.get("/v1/sessions", params={"limit": 100}).json()["items"]:
        client.delete(f"/v1/sessions/{item['id']}")


@pytest.mark.timeout(120)
def test_live_sessions_are_capped(server):
    client, plan_id, _ = server
    _delete_all(client)
    made = [_create(client, plan_id) for _ in range(MAX_SESSIONS)]
    assert [r.status_code for r in made] == [201] * MAX_SESSIONS, [r.text for r in made]
    refused = _create(client, plan_id)
    assert_problem(refused, 429, "too_many_sessions")
    assert refused.headers["retry-after"] == "1"
    assert client.delete(f"/v1/sessions/{made[0].json()['id']}").status_code == 204
    again = _create(client, plan_id)
    assert again.status_code == 201, again.text
    _delete_all(client)


@pytest.mark.timeout(120)
def test_idle_sessions_expire_and_free_their_slot(server):
    client, plan_id, _ = server
    _delete_all(client)
    idle = _create(client, plan_id).json()["id"]
    busy = _create(client, plan_id).json()["id"]
    step = {"steps": 1, "synthetic": {"batch_size": 8}}
    deadline = time.monotonic() + 60
    while client.get(f"/v1/sessions/{idle}").status_code == 200:  # reads keep nothing alive
        assert time.monotonic() < deadline, "the idle session never expired"
        answer = client.post(f"/v1/sessions/{busy}/steps", json=step)  # steps do
        assert answer.status_code == 200, answer.text
        time.sleep(0.2)  # the idle one needs IDLE_S of wall time: poll it, keep busy in use
    assert_problem(client.get(f"/v1/sessions/{idle}"), 410, "session_expired")
    assert_problem(client.post(f"/v1/sessions/{idle}/steps", json=step), 410, "session_expired")
    assert client.get(f"/v1/sessions/{busy}").status_code == 200
    states = {s["id"]: s["state"] for s in client.get("/v1/sessions").json()["items"]}
    assert states == {idle: "expired", busy: "live"}
    assert _create(client, plan_id).status_code == 201  # the expired one holds no slot
    assert client.delete(f"/v1/sessions/{idle}").status_code == 204
    assert_problem(client.get(f"/v1/sessions/{idle}"), 404, "session_not_found")
    _delete_all(client)


@pytest.mark.timeout(120)
def test_session_lists_are_paginated_from_the_store(server):
    client, plan_id, _ = server
    _delete_all(client)
    other = client.post("/v1/meshes", json={"axes": {"data": 4}}).json()["id"]
    first = _create(client, plan_id).json()
    second = _create(client, other).json()
    page = client.get("/v1/sessions", params={"limit": 1})
    assert page.status_code == 200
    assert page.json()["total"] == 2
    [newest] = page.json()["items"]
    assert newest["id"] == second["id"] and newest["state"] == "live"
    assert "params" not in newest and newest["model"] == second["model"]
    [older] = client.get("/v1/sessions", params={"limit": 1, "offset": 1}).json()["items"]
    assert older["id"] == first["id"]
    by_plan = client.get(f"/v1/meshes/{other}/sessions").json()
    assert by_plan["total"] == 1 and [s["id"] for s in by_plan["items"]] == [second["id"]]
    assert_problem(client.get("/v1/meshes/m_nope/sessions"), 404, "mesh_not_found")
    for query in ({"limit": 101}, {"limit": 0}, {"offset": -1}, {"offset": 2**63}):
        assert_problem(client.get("/v1/sessions", params=query), 422, "validation_error")
    _delete_all(client)


@pytest.mark.timeout(300)
def test_deleted_sessions_give_their_memory_back(server):
    """Without ``malloc_trim`` after a delete, glibc kept nearly all of it (docs/LIMITS.md)."""
    client, plan_id, runtime_pid = server
    _delete_all(client)
    runtime = psutil.Process(runtime_pid)
    before = runtime.memory_info().rss
    grown, left = [], []
    for _ in range(2):
        ids = []
        for _ in range(MAX_SESSIONS):
            created = _create(client, plan_id, LARGE)
            assert created.status_code == 201, created.text
            ids.append(created.json()["id"])
            step = {"steps": 1, "synthetic": {"batch_size": 64}}
            assert client.post(f"/v1/sessions/{ids[-1]}/steps", json=step).status_code == 200
        grown.append(runtime.memory_info().rss - before)
        for sid in ids:
            assert client.delete(f"/v1/sessions/{sid}").status_code == 204
        # a delete answers at once; the runtime frees the arrays when it reaches the free
        deadline = time.monotonic() + 60
        while (held := runtime.memory_info().rss - before) >= grown[-1] / 4:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        left.append(held)
    assert min(grown) > 256 * 2**20, f"sessions too small to measure: {grown}"
    assert max(left) < max(grown) / 4, f"grew by {grown}, still held {left} after deletes"
