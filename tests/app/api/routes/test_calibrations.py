"""Calibration profiles over HTTP (DESIGN v1.3, "Calibrations"): ``GET /v1/calibrations``,
``GET /v1/calibrations/{id}``, and ``calibration`` in plans and recommendations."""

from __future__ import annotations

from tests.helpers import assert_problem

GPU_PLAN = {
    "hardware": "h100-sxm",
    "hosts": 2,
    "ici": {"data": 1, "fsdp": 8},
    "dcn": {"data": 2, "fsdp": 1},
    "batch_shape": [32, 8192],
    "model": {"name": "llama3.1-8b", "remat": "full"},
}


def test_profiles_are_listed_and_read_one_by_one(api):
    response = api.get("/v1/calibrations")
    assert response.status_code == 200
    items = {item["id"]: item for item in response.json()["items"]}
    assert {"published-tpu-jax", "published-gpu-jax", "published-gpu-pytorch"} <= set(items)
    tpu = items["published-tpu-jax"]
    assert tpu["kind"] == "published" and tpu["hardware_kind"] == "tpu"
    assert tpu["stack"]["framework"] == "jax" and tpu["stack"]["backend"] == "tpu"
    assert 0 < tpu["constants"]["matmul"] <= 1 and tpu["error"]["training_runs"] >= 40
    one = api.get("/v1/calibrations/published-gpu-pytorch")
    assert one.status_code == 200 and one.json() == items["published-gpu-pytorch"]
    missing = assert_problem(api.get("/v1/calibrations/published-gpu-jx"), 404,
                             "calibration_not_found")  # fmt: skip
    assert "published-gpu-jax" in missing["detail"]


def test_a_plan_names_the_profile_that_priced_it(api):
    default = api.post("/v1/meshes", json=GPU_PLAN)
    assert default.status_code == 201, default.text
    assert default.json()["step_estimate"]["calibration"] == "published-gpu-jax"
    torch = api.post("/v1/meshes", json={**GPU_PLAN, "calibration": "published-gpu-pytorch"})
    assert torch.status_code == 201, torch.text
    step = torch.json()["step_estimate"]
    assert step["calibration"] == "published-gpu-pytorch"
    assert step["step_s"] != default.json()["step_estimate"]["step_s"]
    # a profile of another kind, or none at all, is refused and says what would do
    wrong = api.post("/v1/meshes", json={**GPU_PLAN, "calibration": "published-tpu-jax"})
    assert "published-gpu-jax" in assert_problem(wrong, 422, "invalid_calibration")["detail"]
    unknown = api.post("/v1/meshes", json={**GPU_PLAN, "calibration": "nope"})
    assert_problem(unknown, 422, "unknown_calibration")


def test_maxtext_plans_and_recommendations_take_a_calibration(api):
    body = {
        "hardware": "tpu-v6e",
        "topology": "2x4",
        "maxtext": {"ici_fsdp_parallelism": -1, "per_device_batch_size": 1,
                    "model_name": "llama3.1-8b", "max_target_length": 2048},
        "calibration": "published-tpu-jax",
    }  # fmt: skip
    plan = api.post("/v1/meshes", json=body)
    assert plan.status_code == 201, plan.text
    assert plan.json()["step_estimate"]["calibration"] == "published-tpu-jax"
    rec = api.post(
        "/v1/recommendations",
        json={"hardware": "h100-sxm", "hosts": 2, "model": GPU_PLAN["model"],
              "global_batch": 32, "top_k": 2, "calibration": "published-gpu-pytorch"},
    )  # fmt: skip
    assert rec.status_code == 200, rec.text
    for candidate in rec.json()["candidates"]:
        assert candidate["step_estimate"]["calibration"] == "published-gpu-pytorch"
        assert candidate["plan_request"]["calibration"] == "published-gpu-pytorch"
