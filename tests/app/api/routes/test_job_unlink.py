"""``DELETE /v1/jobs/{job}/plan``: a job is unlinked from its plan, stored or deleted
since (issue 58, class 11), on each store."""

from __future__ import annotations

import pytest

from app.main import create_app
from app.storage.postgres import PostgresStore
from tests.app.api.routes.test_jobs import PLAN_WITH_ESTIMATE
from tests.helpers import StubRuntime, TestClient, assert_problem, make_settings
from tests.postgres_fixtures import store_url


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def client(request, tmp_path_factory):
    """The service on each store in turn (PostgreSQL skips loudly without it, fails
    under CI)."""
    folder = tmp_path_factory.mktemp("unlink")
    with store_url(request) as url:
        settings = make_settings(folder, database_url=url)
        with TestClient(create_app(settings, runtime=StubRuntime(ready=True))) as c:
            assert isinstance(c.app.state.store, PostgresStore) is (url is not None)
            yield c


def _push(client, job: str, step: int, seconds: float) -> None:
    body = {"metrics": {"step_time": [seconds, seconds]}, "step": step}
    assert client.post(f"/v1/jobs/{job}/metrics", json=body).status_code == 201


def _fidelity(client, job: str):
    listed = client.get("/v1/jobs", params={"limit": 1000}).json()["items"]
    in_list = next(j for j in listed if j["job"] == job)["fidelity"]
    one = client.get(f"/v1/jobs/{job}").json()["fidelity"]
    assert in_list == one
    return one


def test_a_job_is_unlinked_from_a_deleted_plan(client):
    plan = client.post("/v1/meshes", json=PLAN_WITH_ESTIMATE).json()
    for step in range(3):
        _push(client, "orphan", step, 2.0)
    assert client.patch("/v1/jobs/orphan", json={"plan": plan["id"]}).status_code == 200
    assert _fidelity(client, "orphan")["plan"] == plan["id"]
    # the plan is deleted: the link stays, pointing at nothing
    assert client.delete(f"/v1/meshes/{plan['id']}").status_code == 204
    gone = _fidelity(client, "orphan")
    assert gone["plan"] == plan["id"] and gone["predicted_step_s"] is None
    # unlinked: no fidelity anywhere, the job and its points kept
    answer = client.delete("/v1/jobs/orphan/plan")
    assert answer.status_code == 204 and answer.content == b""
    assert _fidelity(client, "orphan") is None
    assert client.get("/v1/jobs/orphan").json()["points"] == 3
    # and it is unlinked, as a job never linked is
    assert_problem(client.delete("/v1/jobs/orphan/plan"), 404, "job_link_not_found")
    assert_problem(client.patch("/v1/jobs/orphan", json={"step_time_metric": "t"}), 409,
                   "job_not_linked")  # fmt: skip
    # linked again to a stored plan
    again = client.post("/v1/meshes", json=PLAN_WITH_ESTIMATE).json()
    assert client.patch("/v1/jobs/orphan", json={"plan": again["id"]}).status_code == 200
    assert _fidelity(client, "orphan")["predicted_step_s"] == again["step_estimate"]["step_s"]


def test_unlinking_a_stored_plan_keeps_the_plan(client):
    plan = client.post("/v1/meshes", json=PLAN_WITH_ESTIMATE).json()
    _push(client, "kept", 0, 1.0)
    assert client.patch("/v1/jobs/kept", json={"plan": plan["id"]}).status_code == 200
    assert client.delete("/v1/jobs/kept/plan").status_code == 204
    assert _fidelity(client, "kept") is None
    assert client.get(f"/v1/meshes/{plan['id']}").status_code == 200


def test_unlink_refusals(client):
    assert_problem(client.delete("/v1/jobs/never-pushed/plan"), 404, "job_not_found")
    _push(client, "plain", 0, 1.0)
    assert_problem(client.delete("/v1/jobs/plain/plan"), 404, "job_link_not_found")
    assert_problem(client.delete("/v1/jobs/plain/plan?x=1"), 422, "validation_error")
    assert_problem(client.delete("/v1/jobs/bad name/plan"), 422, "validation_error")
