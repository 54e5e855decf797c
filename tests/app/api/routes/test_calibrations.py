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


def _linked_job(api, job, plan_body, seconds):
    plan = api.post("/v1/meshes", json=plan_body).json()
    points = [{"step": i, "metrics": {"step_time": seconds}} for i in range(5)]
    assert api.post(f"/v1/jobs/{job}/metrics/batch", json={"points": points}).status_code == 201
    assert api.patch(f"/v1/jobs/{job}", json={"plan": plan["id"]}).status_code == 200
    return plan


def test_a_profile_fitted_on_linked_jobs_prices_later_plans(api):
    tpu = {"hardware": "tpu-v6e", "topology": "2x4", "ici": {"fsdp": 8},
           "model": {"name": "llama3.1-8b", "remat": "full"}}  # fmt: skip
    # three jobs whose steps ran 30% slower than the published profile predicts
    plans = []
    for job, batch in (("fit-a", 8), ("fit-b", 16), ("fit-c", 32)):
        body = {**tpu, "batch_shape": [batch, 8192]}
        predicted = api.post("/v1/meshes", json=body).json()["step_estimate"]["step_s"]
        plans.append(_linked_job(api, job, body, 1.3 * predicted))
    created = api.post(
        "/v1/calibrations", json={"kind": "jobs", "jobs": ["fit-a", "fit-b", "fit-c"]}
    )
    assert created.status_code == 201, created.text
    profile = created.json()
    assert created.headers["location"] == f"/v1/calibrations/{profile['id']}"
    assert profile["kind"] == "jobs" and profile["hardware_kind"] == "tpu"
    assert profile["hardware"] == "tpu-v6e" and len(profile["measurements"]) == 3
    error = profile["error"]
    assert error["training_runs"] == 3 and error["leave_one_out_mae"] is not None
    assert error["training_mae"] < 0.05 < error["published_mae"]  # the fit learned the 30%
    assert api.get(f"/v1/calibrations/{profile['id']}").json() == profile
    listed = [p["id"] for p in api.get("/v1/calibrations").json()["items"]]
    assert listed[:3] == sorted(listed[:3]) and profile["id"] in listed
    # a plan priced with it comes within the fit's error of what the jobs measured
    again = api.post("/v1/meshes", json={**tpu, "batch_shape": [16, 8192],
                                         "calibration": profile["id"]})  # fmt: skip
    step = again.json()["step_estimate"]
    assert step["calibration"] == profile["id"]
    measured = profile["measurements"][1]["measured_step_s"]
    assert abs(step["step_s"] / measured - 1) < 0.05
    rec = api.post("/v1/recommendations", json={
        "hardware": "tpu-v6e", "topology": "2x4", "model": tpu["model"], "global_batch": 16,
        "top_k": 1, "calibration": profile["id"]})  # fmt: skip
    assert rec.status_code == 200, rec.text
    assert rec.json()["candidates"][0]["plan_request"]["calibration"] == profile["id"]
    # a GPU plan cannot take a TPU profile
    gpu = api.post("/v1/meshes", json={**GPU_PLAN, "calibration": profile["id"]})
    assert_problem(gpu, 422, "invalid_calibration")


def test_a_jobs_fit_is_refused_with_what_is_missing(api):
    assert (
        api.post(
            "/v1/jobs/no-plan/metrics", json={"step": 0, "metrics": {"step_time": 1.0}}
        ).status_code
        == 201
    )
    unlinked = api.post("/v1/calibrations", json={"kind": "jobs", "jobs": ["no-plan"]})
    assert "linked to no plan" in assert_problem(unlinked, 409, "job_not_linked")["detail"]
    assert_problem(api.post("/v1/calibrations", json={"kind": "jobs", "jobs": ["nobody"]}), 404,
                   "job_not_found")  # fmt: skip
    assert_problem(api.post("/v1/calibrations", json={"kind": "host"}), 422, "validation_error")
    tpu = {"hardware": "tpu-v6e", "topology": "2x4", "ici": {"fsdp": 8}, "batch_shape": [8, 8192],
           "model": {"name": "llama3.1-8b", "remat": "full"}}  # fmt: skip
    _linked_job(api, "mixed-tpu", tpu, 2.0)
    _linked_job(api, "mixed-gpu", GPU_PLAN, 2.0)
    mixed = api.post("/v1/calibrations", json={"kind": "jobs", "jobs": ["mixed-tpu", "mixed-gpu"]})
    assert "one kind at a time" in assert_problem(mixed, 422, "invalid_request")["detail"]
