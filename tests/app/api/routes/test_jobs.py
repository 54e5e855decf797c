"""The HTTP contract of /v1/jobs: pushes, batches, idempotency, reads, multi-source parts."""

from __future__ import annotations

import re

import numpy as np
import pytest

from app.main import create_app
from app.storage.postgres import PostgresStore
from tests.helpers import StubRuntime, TestClient, assert_problem, make_settings, npz_bytes
from tests.postgres_fixtures import store_url

NPZ_HEADERS = {"content-type": "application/x-npz"}


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def client(request, tmp_path_factory):
    """The service on each store in turn: the SQLite file, or a fresh database of the
    session's PostgreSQL (skips loudly without it, fails under CI), dropped after."""
    folder = tmp_path_factory.mktemp("jobs")
    with store_url(request) as url:
        settings = make_settings(folder, database_url=url)
        with TestClient(create_app(settings, runtime=StubRuntime(ready=True))) as c:
            assert isinstance(c.app.state.store, PostgresStore) is (url is not None)
            yield c


def _push(client, job, step, loss, **extra):
    return client.post(
        f"/v1/jobs/{job}/metrics", json={"metrics": {"loss": loss}, "step": step, **extra}
    )


def test_a_step_is_written_once_retries_are_no_ops_and_other_content_conflicts(client):
    first = _push(client, "once", 3, [1.0, 3.0])
    assert first.status_code == 201 and first.json()["reduced"] == {"loss": 2.0}
    again = _push(client, "once", 3, [1.0, 3.0])
    assert again.status_code == 200
    assert again.json()["received_at"] == first.json()["received_at"]
    assert_problem(_push(client, "once", 3, [1.0, 4.0]), 409, "step_conflict")
    points = client.get("/v1/jobs/once/metrics").json()["points"]
    assert [(p["step"], p["reduced"], p["complete"]) for p in points] == [(3, {"loss": 2.0}, True)]


def test_history_in_step_order_and_unknown_jobs_are_empty(client):
    for step in (20, 0, 10):
        assert _push(client, "order", step, [float(step), 1.0]).status_code == 201
    points = client.get("/v1/jobs/order/metrics").json()["points"]
    assert [p["step"] for p in points] == [0, 10, 20]
    assert set(points[0]) == {"step", "reduced", "received_at", "complete", "sources", "spread"}
    # step 0 pushed [0.0, 1.0]: device 0 holds the min, device 1 the max
    assert points[0]["spread"] == {
        "loss": {"min": 0.0, "max": 1.0, "min_device": 0, "max_device": 1}
    }
    empty = client.get("/v1/jobs/never-posted/metrics").json()
    assert empty == {
        "job": "never-posted",
        "kind": "points",
        "downsampled": False,
        "points": [],
        "next_after_step": None,
    }


def test_scalar_metrics_are_stored_as_given(client):
    body = {"metrics": {"loss": [1.0, 2.0], "lr": 0.001, "epoch": 3}, "step": 0}
    answer = client.post("/v1/jobs/scalars/metrics", json=body)
    assert answer.status_code == 201, answer.text
    assert answer.json()["reduced"] == {"loss": 1.5, "lr": 0.001, "epoch": 3.0}


def test_batch_is_all_or_nothing_and_equals_single_pushes(client):
    rng = np.random.default_rng(1)
    points = [
        {
            "step": s,
            "metrics": {"loss": rng.normal(size=8).tolist(), "v": rng.normal(size=(8, 2)).tolist()},
        }
        for s in range(50)
    ]
    batch = client.post("/v1/jobs/batch/metrics/batch", json={"points": points})
    assert batch.status_code == 201, batch.text
    assert batch.json()["created"] == 50 and batch.json()["completed_steps"] == 50
    for point in points[:5]:
        assert client.post("/v1/jobs/single/metrics", json=point).status_code == 201
    single = client.get("/v1/jobs/single/metrics").json()["points"]
    batched = client.get("/v1/jobs/batch/metrics", params={"until_step": 4}).json()["points"]
    assert [p["reduced"] for p in single] == [p["reduced"] for p in batched]  # bit for bit
    retry = client.post("/v1/jobs/batch/metrics/batch", json={"points": points})
    assert retry.status_code == 200 and retry.json()["unchanged"] == 50

    bad = [*({"step": 100 + i, "metrics": {"loss": [1.0]}} for i in range(5)), points[7]]
    bad[-1] = {**points[7], "metrics": {"loss": [0.0] * 8, "v": [[0, 0]] * 8}}
    assert_problem(
        client.post("/v1/jobs/batch/metrics/batch", json={"points": bad}), 409, "step_conflict"
    )
    assert client.get("/v1/jobs/batch/metrics", params={"since_step": 100}).json()["points"] == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"points": []}, "points"),
        (
            {"points": [{"step": 1, "metrics": {"x": [1]}}, {"step": -1, "metrics": {"x": [1]}}]},
            "points.1.step",
        ),
        ({"points": [{"step": 2**63, "metrics": {"x": [1]}}]}, "points.0.step"),
        ({"points": [{"step": 1, "metrics": {"x": "a"}}]}, "points.0.metrics.x"),
        ({"points": [{"step": 1, "metrics": {"x": [1]}}] * 1001}, "points"),
        ({"points": [{"step": 1, "metrics": {"x": [1]}, "extra": 1}]}, "points.0.extra"),
    ],
    ids=["empty", "negative-step", "step-past-int64", "bad-metric", "too-many", "extra-member"],
)
def test_bad_batches_name_the_point(client, body, field):
    problem = assert_problem(
        client.post("/v1/jobs/b/metrics/batch", json=body), 422, "validation_error"
    )
    assert any(e["field"].startswith(field) for e in problem["errors"]), problem


def test_error_paths(client):
    assert_problem(_push(client, "e", 2**63, [1.0]), 422, "validation_error")
    assert_problem(
        client.get("/v1/jobs/e/metrics", params={"since_step": 2**63}), 422, "validation_error"
    )
    assert_problem(client.get("/v1/jobs/e/metrics", params={"limt": 3}), 422, "validation_error")
    assert_problem(client.get("/v1/jobs", params={"page": 3}), 422, "validation_error")
    assert_problem(
        client.get("/v1/jobs/e/metrics", params={"since_step": 5, "until_step": 1}),
        422,
        "validation_error",
    )
    assert_problem(
        client.post(
            "/v1/jobs/e/metrics/batch", content=b"x", headers={"content-type": "text/plain"}
        ),
        415,
        "unsupported_media_type",
    )
    assert_problem(
        client.post(
            "/v1/jobs/e/metrics/batch", content=b"{", headers={"content-type": "application/json"}
        ),
        422,
        "invalid_json",
    )
    assert_problem(client.patch("/v1/jobs/nope", json={"finished": True}), 404, "job_not_found")
    assert_problem(client.patch("/v1/jobs/nope", json={"finished": "yes"}), 422, "validation_error")
    assert_problem(client.delete("/v1/jobs/nope"), 404, "job_not_found")
    assert_problem(client.get("/v1/jobs/nope"), 404, "job_not_found")
    assert_problem(_push(client, "e", 1, [1.0], weights=[1.0, 2.0]), 422, "weights_mismatch")


def test_pages_and_downsampling(client):
    points = [{"step": s * 3, "metrics": {"loss": [float(s)], "v": [[s, s]]}} for s in range(1000)]
    assert client.post("/v1/jobs/long/metrics/batch", json={"points": points}).status_code == 201
    steps, after = [], None
    while True:
        params = {
            "limit": 300,
            "since_step": 30,
            **({"after_step": after} if after is not None else {}),
        }
        page = client.get("/v1/jobs/long/metrics", params=params).json()
        steps += [p["step"] for p in page["points"]]
        after = page["next_after_step"]
        if after is None:
            break
    assert steps == list(range(30, 3000, 3))
    down = client.get("/v1/jobs/long/metrics", params={"max_points": 40}).json()
    assert down["downsampled"] is True and 0 < len(down["buckets"]) <= 40
    assert sum(b["metrics"]["loss"]["count"] for b in down["buckets"]) == 1000
    assert max(b["metrics"]["loss"]["max"] for b in down["buckets"]) == 999.0
    assert down["buckets"][-1]["metrics"]["loss"]["last"] == 999.0
    assert "v" not in down["buckets"][0]["metrics"]  # vectors: pages only
    small = client.get("/v1/jobs/long/metrics", params={"max_points": 2000}).json()
    assert small["downsampled"] is False


def test_list_finish_delete(client):
    assert _push(client, "listed", 5, [1.0]).status_code == 201
    jobs = {j["job"]: j for j in client.get("/v1/jobs", params={"limit": 1000}).json()["items"]}
    entry = jobs["listed"]
    assert (entry["points"], entry["first_step"], entry["last_step"], entry["finished"]) == (
        1,
        5,
        5,
        False,
    )
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", entry["last_push_at"])
    assert client.patch("/v1/jobs/listed", json={"finished": True}).json()["finished"] is True
    assert client.get("/v1/jobs/listed").json()["finished"] is True
    assert client.delete("/v1/jobs/listed").status_code == 204
    assert client.get("/v1/jobs/listed/metrics").json()["points"] == []


PLAN_WITH_ESTIMATE = {
    "hardware": "tpu-v5e",
    "topology": "2x2",
    "ici": {"fsdp": 4},
    "batch_shape": [8, 2048],
    "model": {"name": "llama2-7b", "seq_len": 2048, "remat": "full"},
}


def test_a_job_linked_to_its_plan_answers_predicted_against_measured(client):
    plan = client.post("/v1/meshes", json=PLAN_WITH_ESTIMATE).json()
    predicted = plan["step_estimate"]["step_s"]
    # the first step compiles (slow); the median of the rest is the measured step
    for step, seconds in enumerate([30.0, 2.0, 2.2, 1.8, 2.0]):
        body = {"metrics": {"loss": [1.0, 1.0], "step_time": [seconds, seconds]}, "step": step}
        assert client.post("/v1/jobs/linked/metrics", json=body).status_code == 201
    assert client.get("/v1/jobs/linked").json()["fidelity"] is None
    linked = client.patch("/v1/jobs/linked", json={"plan": plan["id"]})
    assert linked.status_code == 200, linked.text
    fidelity = linked.json()["fidelity"]
    assert fidelity["plan"] == plan["id"] and fidelity["step_time_metric"] == "step_time"
    assert fidelity["predicted_step_s"] == predicted and fidelity["measured_step_s"] == 2.0
    assert fidelity["points"] == 5 and fidelity["error"] == pytest.approx(predicted / 2.0 - 1)
    listed = {j["job"]: j for j in client.get("/v1/jobs", params={"limit": 1000}).json()["items"]}
    assert listed["linked"]["fidelity"] == fidelity
    # another metric name; finishing keeps the link
    other = client.patch("/v1/jobs/linked", json={"step_time_metric": "loss", "finished": True})
    assert other.json()["fidelity"]["measured_step_s"] == 1.0 and other.json()["finished"]
    # refusals: no such plan, a plan without an estimate, a metric with no plan linked
    assert_problem(client.patch("/v1/jobs/linked", json={"plan": "nope"}), 404, "mesh_not_found")
    bare = client.post("/v1/meshes", json={"axes": {"data": -1}, "num_devices": 8}).json()
    assert_problem(client.patch("/v1/jobs/linked", json={"plan": bare["id"]}), 422,
                   "invalid_request")  # fmt: skip
    assert _push(client, "unlinked", 1, [1.0]).status_code == 201
    assert_problem(client.patch("/v1/jobs/unlinked", json={"step_time_metric": "t"}), 409,
                   "job_not_linked")  # fmt: skip
    assert_problem(client.patch("/v1/jobs/unlinked", json={}), 422, "validation_error")
    assert_problem(client.patch("/v1/jobs/nope", json={"plan": plan["id"]}), 404,
                   "job_not_found")  # fmt: skip
    # a deleted job takes its link with it
    assert client.delete("/v1/jobs/linked").status_code == 204
    assert _push(client, "linked", 0, [1.0]).status_code == 201
    assert client.get("/v1/jobs/linked").json()["fidelity"] is None


def test_nan_and_infinities_are_stored_by_the_policy_and_said_in_warnings(client):
    clean = _push(client, "nan-run", 0, [1.0, 2.0])
    assert clean.status_code == 201 and clean.json()["warnings"] == []
    nan = client.post(
        "/v1/jobs/nan-run/metrics",
        json={"step": 1, "metrics": {"loss": [1.0, None], "lr": 0.1}},  # null: NaN
    )
    assert nan.status_code == 201, nan.text
    assert nan.json()["reduced"]["loss"] is None and nan.json()["reduced"]["lr"] == 0.1
    (warning,) = nan.json()["warnings"]
    assert warning.startswith("loss: 1 NaN or infinite value(s)") and "propagate" in warning
    omitted = client.post(
        "/v1/jobs/nan-run/metrics",
        json={"step": 2, "metrics": {"loss": [1.0, None]}, "nan_policy": "omit"},
    )
    assert omitted.json()["reduced"]["loss"] == 1.0 and "omit" in omitted.json()["warnings"][0]
    points = [{"step": 3, "metrics": {"loss": [1.0, None]}},
              {"step": 4, "metrics": {"loss": [None, None], "lr": 0.1}}]  # fmt: skip
    batch = client.post("/v1/jobs/nan-run/metrics/batch", json={"points": points})
    assert batch.status_code == 201, batch.text
    assert batch.json()["warnings"] == [
        "loss: 3 NaN or infinite value(s), stored as null where they reach a reduced value "
        "(nan_policy propagate)"
    ]
    # a uniform batch (decoded as columns) says the same
    uniform = [{"step": s, "metrics": {"loss": [1.0, None]}} for s in (10, 11)]
    columns = client.post("/v1/jobs/nan-run/metrics/batch", json={"points": uniform})
    assert columns.json()["warnings"][0].startswith("loss: 2 NaN"), columns.text
    # infinities come in npz bodies
    body = npz_bytes(loss=np.array([1.0, np.inf]))
    inf = client.post("/v1/jobs/nan-run/metrics", content=body, headers=NPZ_HEADERS,
                      params={"step": 5})  # fmt: skip
    assert inf.status_code == 201 and inf.json()["warnings"][0].startswith("loss: 1 NaN")


@pytest.mark.parametrize("name", ["", "  ", "lo\x00ss", "a\nb", "_weights", "_step"])
def test_empty_blank_control_and_reserved_metric_names_are_refused(client, name):
    body = {"step": 0, "metrics": {name: [1.0, 2.0]}}
    problem = assert_problem(client.post("/v1/jobs/names/metrics", json=body), 422,
                             "invalid_metric_name")  # fmt: skip
    assert "metric name" in problem["detail"]
    batch = {"points": [{"step": 0, "metrics": {name: 1.0}}]}
    assert_problem(client.post("/v1/jobs/names/metrics/batch", json=batch), 422,
                   "invalid_metric_name")  # fmt: skip


def test_a_query_parameter_given_twice_is_refused_not_last_wins(client):
    body = npz_bytes(loss=np.array([1.0, 2.0]), step=np.array([3.0, 4.0]))
    twice = client.post(
        "/v1/jobs/twice/metrics?step=1&reduce=loss:mean&reduce=step:max",
        content=body,
        headers=NPZ_HEADERS,
    )
    assert "given twice" in assert_problem(twice, 422, "validation_error")["detail"]


def test_npz_push_with_source_in_the_query(client):
    body = npz_bytes(loss=np.array([1.0, 2.0]))
    params = {"step": 1, "source": "h-0", "sources": 2}
    first = client.post("/v1/jobs/npz/metrics", content=body, headers=NPZ_HEADERS, params=params)
    assert first.status_code == 201 and first.json()["complete"] is False
    other = {"step": 1, "source": "h-1", "sources": 2}
    done = client.post(
        "/v1/jobs/npz/metrics",
        content=npz_bytes(loss=np.array([3.0, 6.0])),
        headers=NPZ_HEADERS,
        params=other,
    )
    assert done.json()["complete"] is True and done.json()["reduced"] == {"loss": 3.0}


def test_multi_source_parts(client):
    def part(source, loss, step=1, **extra):
        body = {"metrics": {"loss": loss}, "step": step, "source": source, "sources": 3, **extra}
        return client.post("/v1/jobs/multi/metrics", json=body)

    first = part("host-0", [1.0, 2.0])
    assert first.status_code == 201
    assert first.json()["complete"] is False and first.json()["missing_sources"] == [
        "host-1",
        "host-2",
    ]
    assert part("host-0", [1.0, 2.0]).status_code == 200  # retried part
    assert_problem(part("host-0", [1.0, 9.0]), 409, "step_conflict")
    assert_problem(part("host-1", [1.0, 2.0, 3.0]), 422, "part_mismatch")
    assert_problem(part("host-1", [1.0, 2.0], reduce={"loss": "max"}), 422, "part_mismatch")
    assert_problem(_push(client, "multi", 1, [1.0, 2.0]), 422, "sources_mismatch")
    assert part("host-1", [3.0, 4.0]).status_code == 201

    assert client.get("/v1/jobs/multi/metrics").json()["points"] == []  # complete only
    partial = client.get("/v1/jobs/multi/metrics", params={"include_partial": "true"}).json()[
        "points"
    ]
    assert partial[0]["complete"] is False and partial[0]["received_sources"] == [
        "host-0",
        "host-1",
    ]
    assert partial[0]["reduced"] == {"loss": 2.5}
    listed = {j["job"]: j for j in client.get("/v1/jobs", params={"limit": 1000}).json()["items"]}
    assert listed["multi"]["incomplete_step"] == 1 and listed["multi"]["lagging_sources"] == [
        "host-2"
    ]
    scrape = client.get("/metrics").text
    assert 'datarax_job_stragglers{job="multi"} 1.0' in scrape
    assert 'datarax_job_seconds_since_last_push{job="multi"}' in scrape

    last = part("host-2", [5.0, 6.0])
    assert last.status_code == 201 and last.json()["complete"] is True
    assert last.json()["reduced"] == {"loss": 3.5}
    assert_problem(part("host-3", [5.0, 6.0]), 409, "step_conflict")  # a 4th source
    assert part("host-2", [5.0, 6.0]).status_code == 200
    points = client.get("/v1/jobs/multi/metrics").json()["points"]
    assert [(p["step"], p["reduced"], p["sources"]) for p in points] == [(1, {"loss": 3.5}, 3)]


def test_every_operation_has_a_plain_id_a_summary_and_its_error_responses(client):
    doc = client.get("/openapi.json").json()
    ids = []
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            where = f"{method.upper()} {path}"
            op_id = operation.get("operationId", "")
            assert re.fullmatch(r"[a-z]+(_[a-z]+)*", op_id), (where, op_id)
            assert not op_id.endswith(("_get", "_post", "_delete", "_patch")), (where, op_id)
            ids.append(op_id)
            assert operation.get("summary"), where
            takes_input = operation.get("parameters") or operation.get("requestBody")
            errors = [status for status in operation["responses"] if status >= "400"]
            assert errors or not takes_input, where
    assert len(ids) == len(set(ids))
    assert {"create_mesh", "reduce_metrics", "push_job_metrics", "list_jobs"} <= set(ids)
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            assert _has_example(doc, operation), f"{method.upper()} {path} has no example"


def _shows_example(doc: dict, item: dict) -> bool:
    """``item`` (a media type entry or a parameter) carries an example, inline or as its
    schema's (top-level, or the referenced component's) ``examples``."""
    if "example" in item or "examples" in item:
        return True
    schema = item.get("schema") or {}
    if "example" in schema or "examples" in schema:
        return True
    if "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return "example" in schema or "examples" in schema


def _has_example(doc: dict, operation: dict) -> bool:
    """A request body example where the operation has a body; else an example of one of
    its parameters or of a success answer."""
    body = operation.get("requestBody")
    if body:
        return any(_shows_example(doc, c) for c in body["content"].values())
    answers = [
        c
        for status, answer in operation["responses"].items()
        if status < "400"
        for c in answer.get("content", {}).values()
    ]
    return any(_shows_example(doc, p) for p in operation.get("parameters", [])) or any(
        _shows_example(doc, c) for c in answers
    )


def _columnar_points(rng, steps, devices=8):
    return [
        {"step": s, "metrics": {"loss": rng.normal(size=devices).tolist(), "lr": 0.5 / (s + 1)}}
        for s in steps
    ]


def test_the_columnar_batch_path_stores_what_single_pushes_store(client):
    # Every point {"step", "metrics"} with float lists: the vectorised path; a retry of one
    # point as a single push, and the same point in a batch the per-point path takes,
    # must meet the same digest (200) and the same reduced text.
    rng = np.random.default_rng(11)
    points = _columnar_points(rng, range(40))
    points[3]["metrics"]["loss"][2] = 1e308  # an overflowing sum stays what numpy gives
    points[5]["metrics"]["loss"][0] = -0.0
    answer = client.post("/v1/jobs/columnar/metrics/batch", json={"points": points})
    assert answer.status_code == 201 and answer.json()["created"] == 40, answer.text
    for point in points[:6]:
        assert client.post("/v1/jobs/columnar-single/metrics", json=point).status_code == 201
        retry = client.post("/v1/jobs/columnar/metrics", json=point)
        assert retry.status_code == 200, retry.text
    batched = client.get("/v1/jobs/columnar/metrics", params={"until_step": 5}).json()["points"]
    single = client.get("/v1/jobs/columnar-single/metrics").json()["points"]
    assert [p["reduced"] for p in batched] == [p["reduced"] for p in single]
    # The per-point path (an extra member) meets the same stored digests: all unchanged.
    slow = [{**p, "reduce": {}} for p in points]
    again = client.post("/v1/jobs/columnar/metrics/batch", json={"points": slow})
    assert again.status_code == 200 and again.json()["unchanged"] == 40
    changed = [dict(p) for p in points]
    changed[7] = {"step": 7, "metrics": {"loss": [0.0] * 8, "lr": 0.5 / 8}}
    assert_problem(
        client.post("/v1/jobs/columnar/metrics/batch", json={"points": changed}),
        409,
        "step_conflict",
    )
    # An all-integer list is int64, not float64, for the digest: not the columnar path.
    ints = [{"step": 100, "metrics": {"loss": [1, 2]}}, {"step": 101, "metrics": {"loss": [3, 4]}}]
    assert client.post("/v1/jobs/columnar/metrics/batch", json={"points": ints}).status_code == 201
    for point in ints:
        assert client.post("/v1/jobs/columnar/metrics", json=point).status_code == 200


def test_npz_batches_store_what_json_batches_store(client):
    rng = np.random.default_rng(12)
    points = _columnar_points(rng, range(10, 30), devices=4)
    body = npz_bytes(
        _step=np.array([p["step"] for p in points]),
        loss=np.array([p["metrics"]["loss"] for p in points]),
        lr=np.array([p["metrics"]["lr"] for p in points]),
    )
    url = "/v1/jobs/npz-batch/metrics/batch"
    first = client.post(url, content=body, headers=NPZ_HEADERS)
    assert first.status_code == 201 and first.json()["created"] == 20, first.text
    assert client.post(url, content=body, headers=NPZ_HEADERS).json()["unchanged"] == 20
    assert client.post(url, json={"points": points}).status_code == 200  # same digests
    assert (
        client.post("/v1/jobs/npz-json/metrics/batch", json={"points": points}).status_code == 201
    )
    a = client.get("/v1/jobs/npz-batch/metrics").json()["points"]
    b = client.get("/v1/jobs/npz-json/metrics").json()["points"]
    assert [p["reduced"] for p in a] == [p["reduced"] for p in b]

    # Options in the query; float32 and weights take the per-point path, same rules.
    weighted = npz_bytes(
        _step=np.array([0, 1]),
        loss=np.array([[1.0, 3.0], [2.0, np.nan]], dtype=np.float32),
        _weights=np.array([[1.0, 3.0], [1.0, 1.0]]),
    )
    answer = client.post(
        "/v1/jobs/npz-weighted/metrics/batch",
        content=weighted,
        headers=NPZ_HEADERS,
        params={"nan_policy": "omit", "reduce": "loss:mean"},
    )
    assert answer.status_code == 201, answer.text
    got = client.get("/v1/jobs/npz-weighted/metrics").json()["points"]
    assert [p["reduced"]["loss"] for p in got] == [2.5, 2.0]

    assert_problem(
        client.post(url, content=npz_bytes(loss=np.ones((2, 2))), headers=NPZ_HEADERS),
        422,
        "validation_error",
    )
    assert_problem(
        client.post(
            url, content=npz_bytes(_step=np.arange(2), loss=np.ones((3, 2))), headers=NPZ_HEADERS
        ),
        422,
        "invalid_tensor",
    )
    assert_problem(
        client.post(url, json={"points": points}, params={"source": "h-0"}),
        422,
        "validation_error",
    )


def test_npz_batches_of_parts_merge_like_json_parts(client):
    rng = np.random.default_rng(13)
    values = rng.normal(size=(6, 3 * 2))
    for host in range(3):
        part = values[:, host * 2 : (host + 1) * 2]
        if host == 1:  # one host in JSON, the others in npz
            points = [{"step": s, "metrics": {"loss": part[s].tolist()}} for s in range(6)]
            body = {"points": points, "source": "host-1", "sources": 3}
            answer = client.post("/v1/jobs/npz-parts/metrics/batch", json=body)
        else:
            answer = client.post(
                "/v1/jobs/npz-parts/metrics/batch",
                content=npz_bytes(_step=np.arange(6), loss=part),
                headers=NPZ_HEADERS,
                params={"source": f"host-{host}", "sources": 3},
            )
        assert answer.status_code == 201, answer.text
    assert answer.json()["completed_steps"] == 6
    got = client.get("/v1/jobs/npz-parts/metrics").json()["points"]
    for s in range(6):
        one = client.post(
            "/v1/jobs/npz-parts-whole/metrics",
            json={"step": s, "metrics": {"loss": values[s].tolist()}},
        )
        assert one.json()["reduced"] == got[s]["reduced"]


def test_a_point_takes_at_most_1000_metrics(client):
    many = {f"m{i}": [1.0, 2.0] for i in range(1001)}
    single = client.post("/v1/jobs/wide/metrics", json={"step": 1, "metrics": many})
    assert "1001 metrics" in assert_problem(single, 422, "too_many_metrics")["detail"]
    batch = {"points": [{"step": s, "metrics": many} for s in (1, 2)]}
    problem = assert_problem(
        client.post("/v1/jobs/wide/metrics/batch", json=batch), 422, "too_many_metrics"
    )
    assert "point 0" in problem["detail"]
    npz = npz_bytes(_step=np.array([1]), **{k: np.ones((1, 2)) for k in many})
    assert_problem(
        client.post(
            "/v1/jobs/wide/metrics/batch",
            content=npz,
            headers={"content-type": "application/x-npz"},
        ),
        422,
        "too_many_metrics",
    )
    exactly = {f"m{i}": [1.0, 2.0] for i in range(1000)}
    assert (
        client.post("/v1/jobs/wide/metrics", json={"step": 1, "metrics": exactly}).status_code
        == 201
    )
    assert client.get("/v1/jobs/wide/metrics").json()["points"][0]["step"] == 1


def test_points_without_metrics_are_refused_alone_and_in_batches(client):
    # Schemathesis found the single push answering 500 (no arrays to hash); a batch of two
    # such points was stored through the grouped reduce. Both are 422 empty_metrics.
    assert_problem(
        client.post("/v1/jobs/empty/metrics", json={"metrics": {}, "step": 0}), 422, "empty_metrics"
    )
    for points in ([{"metrics": {}, "step": 1}], [{"metrics": {}, "step": s} for s in (1, 2)]):
        answer = client.post("/v1/jobs/empty/metrics/batch", json={"points": points})
        assert_problem(answer, 422, "empty_metrics")


@pytest.mark.parametrize("path", ["json", "json-batch", "npz", "npz-batch"])
def test_max_point_values_is_a_setting_on_every_path(tmp_path, path):
    settings = make_settings(tmp_path, max_point_values=8)
    with TestClient(create_app(settings, runtime=StubRuntime(ready=True))) as c:
        for width, status in ((9, 422), (8, 201)):
            job = f"values-{width}"
            value = np.ones((2, width))
            if path == "json":
                body = {"metrics": {"v": value.tolist()}, "step": 1}
                answer = c.post(f"/v1/jobs/{job}/metrics", json=body)
            elif path == "json-batch":
                points = [{"metrics": {"v": value.tolist()}, "step": s} for s in (1, 2)]
                answer = c.post(f"/v1/jobs/{job}/metrics/batch", json={"points": points})
            elif path == "npz":
                answer = c.post(
                    f"/v1/jobs/{job}/metrics?step=1",
                    content=npz_bytes(v=value),
                    headers=NPZ_HEADERS,
                )
            else:
                body = npz_bytes(_step=np.array([1, 2]), v=np.stack([value, value]))
                answer = c.post(f"/v1/jobs/{job}/metrics/batch", content=body, headers=NPZ_HEADERS)
            if status == 422:
                detail = assert_problem(answer, 422, "value_too_large")["detail"]
                assert "DATARAX_MAX_POINT_VALUES" in detail and "9" in detail
                assert c.get(f"/v1/jobs/{job}").status_code == 404
            else:
                assert answer.status_code == 201, answer.text
