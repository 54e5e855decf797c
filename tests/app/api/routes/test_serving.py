"""Serving plans and serving recommendations over HTTP (issue 57): ``POST /v1/meshes``
with ``serving`` (stored and read back), ``POST /v1/recommendations`` with ``serving`` and
``slo``, and the 422s of what a serving plan refuses."""

from __future__ import annotations

import pytest

from datarax.answers.plans import MeshPlan
from datarax.answers.serving import ServingEstimate, ServingMemory, ServingRecommendations
from tests.helpers import assert_problem

SERVING = {"input_tokens": 1000, "output_tokens": 1000, "concurrency": 64}
V6E_70B = {
    "hardware": "tpu-v6e",
    "topology": "2x4",
    "ici": {"tensor": 8},
    "model": {"name": "llama3.1-70b"},
    "serving": SERVING,
}
DESIGN_ESTIMATE = {
    "replicas", "weights_bytes", "kv_bytes_per_token", "kv_capacity_tokens", "max_batch",
    "batch", "ttft_s", "tpot_s", "output_tokens_per_s", "requests_per_s", "bottleneck",
    "calibration", "engine",
}  # fmt: skip
"""The members DESIGN v1.4 ("Serving plans") fixes."""
H100_8B = {
    "hardware": "h100-sxm",
    "hosts": 1,
    "ici": {"data": 8},
    "model": {"name": "llama3.1-8b"},
    "serving": SERVING,
}


def test_a_serving_plan_is_priced_stored_and_read_back(api):
    response = api.post("/v1/meshes", json=V6E_70B)
    assert response.status_code == 201, response.text
    plan = response.json()
    est, memory = plan["serving_estimate"], plan["memory_per_device"]
    assert DESIGN_ESTIMATE <= set(est)
    assert set(memory) == {"weights", "kv_cache", "activations", "total", "usable", "fits"}
    assert memory["fits"] is True and memory["total"] <= memory["usable"]
    # 8 kv heads over tensor 8: one head a device, 80 layers, bfloat16
    assert est["kv_bytes_per_token"] == 2 * 128 * 80 * 2
    assert est["replicas"] == 1 and est["batch"] == 64 and est["engine"] == "vllm"
    assert est["calibration"] == "published-tpu-vllm"
    assert 0 < est["tpot_s"] < est["ttft_s"] < 1 and est["output_tokens_per_s"] > 0
    assert plan["serving"]["weight_dtype"] == "bfloat16" and plan["model"]["layers"] == 80
    assert plan["total_devices"] == 8 and plan["axes"] == {"tensor": 8}
    assert "step_estimate" not in plan
    parsed = MeshPlan.from_json(plan)
    assert isinstance(parsed.memory_per_device, ServingMemory)
    assert isinstance(parsed.serving_estimate, ServingEstimate)
    again = api.get(f"/v1/meshes/{plan['id']}")
    assert again.status_code == 200 and again.json()["serving_estimate"] == est


def test_replicas_over_the_data_axis(api):
    plan = api.post("/v1/meshes", json=H100_8B).json()
    est = plan["serving_estimate"]
    assert est["replicas"] == 8 and est["batch"] == 8  # 64 clients over 8 replicas
    assert est["kv_bytes_per_token"] == 2 * 8 * 128 * 32 * 2


BAD_SERVING_PLANS = [
    ("fsdp", {"ici": {"fsdp": 8}}, "invalid_parallelism"),
    ("context", {"ici": {"context": 8}}, "invalid_parallelism"),
    ("expert-on-dense", {"ici": {"expert": 8}}, "invalid_parallelism"),
    ("unknown-weight-dtype", {"serving": {**SERVING, "weight_dtype": "int3"}}, "validation_error"),
    ("unknown-kv-dtype", {"serving": {**SERVING, "kv_dtype": "int4"}}, "validation_error"),
    ("batch-shape", {"batch_shape": [8, 1024]}, "validation_error"),
    ("optimizer", {"optimizer": "adam"}, "validation_error"),
    ("remat", {"model": {"name": "llama3.1-8b", "remat": "full"}}, "validation_error"),
    ("mlp", {"model": {"kind": "mlp", "features": [8, 8]}}, "validation_error"),
    ("short-max-model-len", {"serving": {**SERVING, "max_model_len": 10}}, "invalid_serving"),
    ("jetstream-on-gpu", {"serving": {**SERVING, "engine": "jetstream"}}, "invalid_serving"),
    ("tensor-over-heads", {"ici": {"tensor": -1}, "hosts": 8,
                           "dcn": {"tensor": 8}}, "tensor_not_divisible"),
    ("training-profile", {"calibration": "published-gpu-jax"}, "unknown_calibration"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "code"), [c[1:] for c in BAD_SERVING_PLANS], ids=[c[0] for c in BAD_SERVING_PLANS]
)
def test_what_a_serving_plan_refuses(api, change, code):
    problem = assert_problem(api.post("/v1/meshes", json={**H100_8B, **change}), 422, code)
    if code == "invalid_parallelism" and "expert" not in str(change):
        assert "tensor, expert, stage and data" in problem["detail"]


def test_serving_recommendation_with_an_slo(api):
    body = {
        "hardware": "tpu-v5e",
        "topology": "4x4",
        "model": {"name": "llama3.1-8b"},
        "serving": SERVING,
        "slo": {"ttft_s": 1.0, "tpot_s": 0.04},
        "top_k": 2,
    }
    response = api.post("/v1/recommendations", json=body)
    assert response.status_code == 200, response.text
    out = response.json()
    parsed = ServingRecommendations.from_json(out)
    assert len(parsed.candidates) == 2 and parsed.slo == {"ttft_s": 1.0, "tpot_s": 0.04}
    first, second = (c.serving_estimate for c in parsed.candidates)
    assert first.output_tokens_per_s_per_device >= second.output_tokens_per_s_per_device
    assert all(c.serving_estimate.tpot_s <= 0.04 for c in parsed.candidates)
    codes = {r.code for r in parsed.rejections}
    assert {"does_not_fit", "misses_slo"} <= codes
    assert sum(out["rejected"].values()) == len(out["rejections"])
    # the best candidate's plan request plans it
    again = api.post("/v1/meshes", json=out["candidates"][0]["plan_request"])
    assert again.status_code == 201, again.text
    assert again.json()["serving_estimate"]["tpot_s"] == pytest.approx(first.tpot_s)


def test_serving_recommendation_refuses_a_bad_slo(api):
    body = {"hardware": "tpu-v5e", "topology": "2x4", "model": {"name": "llama3.1-8b"},
            "serving": SERVING, "slo": {"tpot_s": -1}}  # fmt: skip
    assert_problem(api.post("/v1/recommendations", json=body), 422, "validation_error")
    nothing = {**body, "topology": "2x2", "model": {"name": "llama3.1-405b"}, "slo": None}
    assert_problem(api.post("/v1/recommendations", json=nothing), 422, "no_plan_fits")


def test_a_serving_plan_is_not_launched_as_a_training_job(api):
    plan = api.post("/v1/meshes", json=V6E_70B).json()
    for target in ("maxtext", "slurm"):  # jobset runs vLLM: test_serving_launch.py
        response = api.post(f"/v1/meshes/{plan['id']}/launch", json={"target": target})
        problem = assert_problem(response, 422, "launch_target_unavailable")
        assert "serving plan" in problem["detail"]
    env = api.post(f"/v1/meshes/{plan['id']}/launch", json={"target": "env"})
    assert env.status_code == 200, env.text
