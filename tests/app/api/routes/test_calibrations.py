"""Calibration profiles over HTTP (DESIGN v1.3, "Calibrations"): ``GET /v1/calibrations``,
``GET /v1/calibrations/{id}``, and ``calibration`` in plans and recommendations."""

from __future__ import annotations

import time

from tests.helpers import assert_problem

GPU_PLAN = {
    "hardware": "h100-sxm",
    "hosts": 2,
    "ici": {"data": 1, "fsdp": 8},
    "dcn": {"data": 2, "fsdp": 1},
    "batch_shape": [32, 8192],
    "model": {"name": "llama3.1-8b", "remat": "full"},
}


def test_serving_profiles_are_listed_read_and_kept_to_serving(api):
    """DESIGN v1.4: a stack.framework per serving engine, listed beside the training
    profiles; a training plan refuses one, and none can be deleted."""
    items = {item["id"]: item for item in api.get("/v1/calibrations?limit=1000").json()["items"]}
    serving = {"published-tpu-jetstream", "published-gpu-tensorrt-llm", "published-gpu-vllm"}
    assert serving <= set(items)
    one = api.get("/v1/calibrations/published-tpu-jetstream")
    assert one.status_code == 200 and one.json() == items["published-tpu-jetstream"]
    assert one.json()["stack"]["framework"] != "jax"
    plan = {**GPU_PLAN, "calibration": "published-tpu-jetstream"}
    problem = assert_problem(api.post("/v1/meshes", json=plan), 422, "invalid_calibration")
    assert "serving" in problem["detail"]
    assert_problem(api.delete("/v1/calibrations/published-gpu-vllm"), 409, "calibration_published")


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
    assert_problem(api.post("/v1/calibrations", json={"kind": "jobs"}), 422, "validation_error")
    tpu = {"hardware": "tpu-v6e", "topology": "2x4", "ici": {"fsdp": 8}, "batch_shape": [8, 8192],
           "model": {"name": "llama3.1-8b", "remat": "full"}}  # fmt: skip
    _linked_job(api, "mixed-tpu", tpu, 2.0)
    _linked_job(api, "mixed-gpu", GPU_PLAN, 2.0)
    mixed = api.post("/v1/calibrations", json={"kind": "jobs", "jobs": ["mixed-tpu", "mixed-gpu"]})
    assert "one kind at a time" in assert_problem(mixed, 422, "invalid_request")["detail"]


CPU_PLAN = {
    "hardware": "cpu",
    "hosts": 1,
    "ici": {"fsdp": 8},
    "batch_shape": [16, 512],
    "model": {"kind": "transformer", "layers": 2, "d_model": 256, "d_ff": 1024, "heads": 4,
              "kv_heads": 4, "vocab": 4096, "seq_len": 512},
}  # fmt: skip


def test_the_host_measures_itself_and_plans_on_its_devices_then_use_it(api):
    # issue 39, section 2: 202 at once, the stages measured on the runtime's 8 CPU
    # devices with their progress visible, the constants fitted and stored with the rows
    # and the versions; a plan on hardware of that device_kind then uses it by default
    started = api.post("/v1/calibrations", json={"kind": "host"})
    assert started.status_code == 202, started.text
    body = started.json()
    location = started.headers["location"]
    assert location == f"/v1/calibrations/{body['id']}" and body["id"].startswith("host-")
    assert body["status"] == "running" and body["constants"] is None
    assert body["hardware"] == "cpu" and body["device_kind"] == "cpu"
    stages = ["overhead", "matmul", "attention", "hbm", "collectives", "overlap", "step"]
    assert body["progress"]["stages"] == stages
    # one at a time; a profile still measuring has no constants to price with
    assert_problem(api.post("/v1/calibrations", json={"kind": "host"}), 409,
                   "calibration_running")  # fmt: skip
    early = api.post("/v1/meshes", json={**CPU_PLAN, "calibration": body["id"]})
    assert "running" in assert_problem(early, 422, "invalid_calibration")["detail"]
    seen = set()
    deadline = time.monotonic() + 300
    while (done := api.get(location).json())["status"] == "running":
        seen.add(tuple(done["progress"]["done"]))
        assert time.monotonic() < deadline, done["progress"]
        time.sleep(0.2)
    assert done["status"] == "done", done.get("problem")
    assert done["progress"]["done"] == stages and len(seen) >= 1
    constants = done["constants"]
    assert 0 < constants["matmul"] and 0 < constants["attention"] and 0 < constants["hbm"]
    assert constants["overhead_s"] > 0 and body["id"] in constants["source"]
    assert {row["stage"] for row in done["measurements"]} == set(stages)
    kinds = {row["kind"] for row in done["measurements"] if row["stage"] == "collectives"}
    assert kinds == {"all-gather", "reduce-scatter", "all-reduce", "all-to-all"}
    # the collectives' own figures and the overlap are measured, not the published ones
    assert 0 < constants["link"] and constants["collective_s"] >= 0
    assert 0 <= constants["overlap"] <= 1 and constants["layer_s"] >= 0
    assert {row["dtype"] for row in done["measurements"] if row["stage"] == "hbm"} == {
        "bfloat16", "float32"}  # fmt: skip
    assert done["stack"]["jax"] and done["stack"]["jaxlib"] and done["stack"]["backend"] == "cpu"
    assert any(item["id"] == body["id"] for item in api.get("/v1/calibrations").json()["items"])
    # the default for hardware of that device_kind; a published one when named
    plan = api.post("/v1/meshes", json=CPU_PLAN)
    assert plan.status_code == 201, plan.text
    assert plan.json()["step_estimate"]["calibration"] == body["id"]
    named = api.post("/v1/meshes", json={**CPU_PLAN, "calibration": "published-cpu-jax"})
    assert named.json()["step_estimate"]["calibration"] == "published-cpu-jax"
    assert named.json()["step_estimate"]["step_s"] != plan.json()["step_estimate"]["step_s"]
    # other hardware keeps its published default
    gpu = api.post("/v1/meshes", json=GPU_PLAN)
    assert gpu.json()["step_estimate"]["calibration"] == "published-gpu-jax"


def test_a_host_calibration_of_devices_the_named_hardware_does_not_describe_is_refused(api):
    wrong = api.post("/v1/calibrations", json={"kind": "host", "hardware": "tpu-v5p"})
    assert "'TPU v5'" in assert_problem(wrong, 422, "invalid_calibration")["detail"]
    assert_problem(api.post("/v1/calibrations", json={"kind": "host", "hardware": "tpu-v9"}),
                   422, "unknown_hardware")  # fmt: skip
    assert_problem(api.post("/v1/calibrations", json={"kind": "host", "jobs": ["a"]}), 422,
                   "validation_error")  # fmt: skip
