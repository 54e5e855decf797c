"""``POST /v1/recommendations``: ranked (ici, dcn) factorisations that post back as plans."""

from __future__ import annotations

import math

import pytest

from datarax.answers.estimates import MemoryEstimate, Recommendations, StepEstimate
from tests.app.api.routes.test_hardware import TRANSFORMER
from tests.helpers import assert_problem

RECOMMEND = {
    "hardware": "tpu-v5e",
    "topology": "4x4",
    "slices": 2,
    "model": TRANSFORMER,
    "global_batch": 64,
    "top_k": 3,
}


def test_recommendations_post_back_unchanged(api):
    response = api.post("/v1/recommendations", json=RECOMMEND)
    assert response.status_code == 200, response.text
    answer = response.json()
    candidates = answer["candidates"]
    assert [c["rank"] for c in candidates] == [1, 2, 3]
    assert answer["considered"] == 45
    assert answer["considered"] >= len(candidates) + sum(answer["rejected"].values())
    steps = [c["step_estimate"]["step_s"] for c in candidates]
    assert steps == sorted(steps)
    # the answer is its class's JSON: parsed into the typed classes and back, unchanged
    parsed = Recommendations.from_json(answer)
    assert parsed.to_json() == answer and "note" not in answer and parsed.note is None
    first = parsed.candidates[0]
    assert isinstance(first.step_estimate, StepEstimate)
    assert isinstance(first.memory_per_device, MemoryEstimate) and first.flags is None
    for candidate in candidates:
        assert candidate["memory_per_device"]["fits"] is True
        posted = api.post("/v1/meshes", json=candidate["plan_request"])
        assert posted.status_code == 201, posted.text
        plan = posted.json()
        assert plan["ici"] == candidate["ici"] and plan["dcn"] == candidate["dcn"]
        assert math.prod(plan["axes"].values()) == 32
        assert plan["step_estimate"]["step_s"] == pytest.approx(
            candidate["step_estimate"]["step_s"]
        )


def test_recommendations_on_gpu_hosts(api):
    body = {"hardware": "h100-sxm", "hosts": 2, "model": TRANSFORMER, "global_batch": 16}
    response = api.post("/v1/recommendations", json=body)
    assert response.status_code == 200, response.text
    first = response.json()["candidates"][0]
    assert first["plan_request"]["hosts"] == 2
    assert api.post("/v1/meshes", json=first["plan_request"]).status_code == 201


def test_nothing_fits_is_no_plan_fits(api):
    big = {**TRANSFORMER, "layers": 96, "d_model": 12288, "d_ff": 49152, "heads": 96,
           "kv_heads": 96}  # fmt: skip
    body = {**RECOMMEND, "model": big, "global_batch": 4096}
    problem = assert_problem(api.post("/v1/recommendations", json=body), 422, "no_plan_fits")
    assert "GiB" in problem["detail"]


BAD_RECOMMENDATIONS = [
    ("unknown_hardware", {"hardware": "tpu-v9"}),
    ("missing_topology", {"topology": None}),
    ("unknown_axis_role", {"axes": ["data", "pipe"]}),
    ("validation_error", {"top_k": 0}),
    ("validation_error", {"global_batch": 0}),
    ("validation_error", {"model": {"kind": "rnn"}}),
]


@pytest.mark.parametrize(
    ("code", "change"),
    BAD_RECOMMENDATIONS,
    ids=[c[0] + str(i) for i, c in enumerate(BAD_RECOMMENDATIONS)],
)
def test_bad_recommendation_is_422_with_code(api, code, change):
    assert_problem(api.post("/v1/recommendations", json={**RECOMMEND, **change}), 422, code)


def test_recommendations_take_a_named_model_and_say_how_they_rank(api):
    body = {
        "hardware": "tpu-v6e",
        "topology": "16x16",
        "model": {"name": "llama3.1-70b", "remat": "full"},
        "global_batch": 256,
        "top_k": 100,
        "optimizer": {"name": "adamw"},
    }
    response = api.post("/v1/recommendations", json=body)
    assert response.status_code == 200, response.text
    out = response.json()
    steps = [c["step_estimate"]["step_s"] for c in out["candidates"]]
    assert steps == sorted(steps) and "step_s" in out["ranked_by"]
    assert len(out["candidates"]) < 100 and "of the top_k 100" in out["note"]
    assert Recommendations.from_json(out).note == out["note"]
    best = out["candidates"][0]["plan_request"]
    assert best["model"]["name"] == "llama3.1-70b"
    assert api.post("/v1/meshes", json=best).status_code == 201


def test_recommendations_search_stage_and_context_axes_with_the_requests_options(api):
    # issue 38: the request lists stage and context axes and says how they run; every
    # candidate is priced with that pipeline and strategy, and its plan_request carries
    # them, so posting it back plans the same step
    model = {"name": "llama3.1-8b", "seq_len": 32768, "remat": "full"}
    body = {"hardware": "h100-sxm", "hosts": 4, "model": model, "global_batch": 32,
            "axes": ["data", "stage", "context", "fsdp"], "top_k": 5,
            "fixed_dcn": {"data": 1, "context": 1, "fsdp": 1},
            "pipeline": {"microbatches": 4, "schedule": "1f1b"},
            "context_parallel": {"strategy": "ring"},
            "optimizer": {"name": "adam", "shard_over_data": True}}  # fmt: skip
    response = api.post("/v1/recommendations", json=body)
    assert response.status_code == 200, response.text
    candidates = response.json()["candidates"]
    # the pipeline over the hosts, a context split inside one among them
    assert candidates and all(c["dcn"]["stage"] == 4 for c in candidates)
    assert any(c["ici"]["context"] > 1 for c in candidates)
    for candidate in candidates:
        request = candidate["plan_request"]
        sizes = {a: candidate["ici"][a] * candidate["dcn"][a] for a in candidate["ici"]}
        assert ("pipeline" in request) == (sizes["stage"] > 1)
        assert ("context_parallel" in request) == (sizes["context"] > 1)
        assert request["optimizer"] == {"name": "adam", "shard_over_data": True}
        if sizes["stage"] > 1:
            assert candidate["step_estimate"]["pipeline"]["schedule"] == "1f1b"
            assert request["pipeline"] == {"microbatches": 4, "schedule": "1f1b"}
        posted = api.post("/v1/meshes", json=request)
        assert posted.status_code == 201, posted.text
        assert posted.json()["step_estimate"]["step_s"] == pytest.approx(
            candidate["step_estimate"]["step_s"]
        )
    # options for axes the search does not have are refused, not ignored
    lone = {**body, "axes": ["data", "fsdp"]}
    del lone["fixed_dcn"]
    problem = assert_problem(api.post("/v1/recommendations", json=lone), 422,
                             "invalid_parallelism")  # fmt: skip
    assert "pipeline" in problem["detail"]
