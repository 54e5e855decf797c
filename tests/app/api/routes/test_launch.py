"""Launching a plan over HTTP (DESIGN v1.2): MaxText args, JobSet (JSON and YAML),
SLURM, per-process env, MaxText configs as plan requests, and the refusals."""

from __future__ import annotations

import yaml

from tests.helpers import assert_problem

TPU_PLAN = {
    "hardware": "tpu-v5e",
    "topology": "4x4",
    "slices": 2,
    "ici": {"data": 1, "fsdp": 16, "tensor": 1},
    "dcn": {"data": 2},
    "batch_shape": [64, 2048],
    "model": {"name": "llama2-7b", "seq_len": 2048, "remat": "full"},
}
GPU_PLAN = {"hardware": "h100-sxm", "hosts": 2, "ici": {"data": 1, "fsdp": 8}, "dcn": {"data": 2}}
EXTRA_ARGS = ["run_name=first-hour", "base_output_directory=gs://bucket/runs",
              "per_device_batch_size=4"]  # fmt: skip
MAXTEXT_BODY = {
    "hardware": "tpu-v6e",
    "topology": "2x4",
    "maxtext": {
        "ici_fsdp_parallelism": -1,
        "per_device_batch_size": 3,
        "max_target_length": 8192,
        "model_name": "llama3.1-8b",
        "weight_dtype": "float32",
        "remat_policy": "custom",
        "decoder_layer_input": "offload",
        "query_proj": "offload",
        "key_proj": "offload",
        "value_proj": "offload",
        "out_proj": "offload",
    },
}
# issue 38: a pipelined plan on 64 H100 hosts and an expert-parallel TPU plan
PIPELINED_GPU_PLAN = {"hardware": "h100-sxm", "hosts": 16, "ici": {"stage": 1, "fsdp": 8},
                      "dcn": {"stage": 4, "fsdp": 4}, "batch_shape": [256, 8192],
                      "model": {"name": "llama3.1-8b", "remat": "full"},
                      "pipeline": {"microbatches": 8, "schedule": "circular",
                                   "layers_per_stage": 2}}  # fmt: skip
NINE_STAGE_PLAN = {"hardware": "h100-sxm", "hosts": 9, "ici": {"stage": 1, "fsdp": 8},
                   "dcn": {"stage": 9}, "batch_shape": [96, 4096],
                   "model": {"name": "llama3.1-405b", "remat": "full"},
                   "pipeline": {"microbatches": 12}}  # fmt: skip
EXPERT_TPU_PLAN = {"hardware": "tpu-v5p", "topology": "4x4x8", "ici": {"fsdp": 16, "expert": 8},
                   "batch_shape": [128, 4096], "model": {"name": "mixtral-8x7b"}}  # fmt: skip


def _plan(api, body):
    response = api.post("/v1/meshes", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def test_maxtext_args_and_libtpu_flags(api):
    plan = _plan(api, TPU_PLAN)
    response = api.post(f"/v1/meshes/{plan['id']}/launch", json={"target": "maxtext"})
    assert response.status_code == 200, response.text
    config = response.json()
    args = dict(a.split("=", 1) for a in config["args"])
    assert args["ici_fsdp_parallelism"] == "16" and args["dcn_data_parallelism"] == "2"
    assert args["ici_tensor_parallelism"] == "1" and args["num_slices"] == "2"
    assert args["per_device_batch_size"] == "2" and args["max_target_length"] == "2048"
    assert config["env"]["LIBTPU_INIT_ARGS"] and config["env_sources"]["LIBTPU_INIT_ARGS"]
    assert config["command"][:3] == ["python3", "-m", "maxtext.trainers.pre_train.train"]


def test_a_jobset_manifest_in_json_and_yaml(api):
    plan = _plan(api, TPU_PLAN)
    body = {"target": "jobset", "image": "example.com/maxtext:1", "queue": "tpu-queue"}
    config = api.post(f"/v1/meshes/{plan['id']}/launch", json=body).json()
    manifest = config["manifest"]
    assert config["warnings"] == []
    assert manifest["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and manifest["kind"] == "JobSet"
    assert manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "tpu-queue"
    (job,) = manifest["spec"]["replicatedJobs"]
    assert job["replicas"] == 2  # one per slice
    as_yaml = api.post(
        f"/v1/meshes/{plan['id']}/launch", json=body, headers={"Accept": "application/yaml"}
    )
    assert as_yaml.status_code == 200
    assert as_yaml.headers["content-type"].startswith("application/yaml")
    assert yaml.safe_load(as_yaml.text) == manifest


def test_extra_args_and_env_come_after_the_generated_ones(api):
    plan = _plan(api, TPU_PLAN)
    url = f"/v1/meshes/{plan['id']}/launch"
    extra = {
        "extra_args": EXTRA_ARGS,
        "extra_env": {"WANDB_MODE": "offline", "LIBTPU_INIT_ARGS": "--xla_tpu_x=true"},
    }
    config = api.post(url, json={"target": "maxtext", **extra}).json()
    args = config["args"]
    # after the generated ones; the generated per_device_batch_size=2 gives way, and says so
    assert args[-3:] == extra["extra_args"]
    assert "per_device_batch_size=2" not in args and "ici_fsdp_parallelism=16" in args
    assert config["env"]["WANDB_MODE"] == "offline"
    assert config["env"]["LIBTPU_INIT_ARGS"] == "--xla_tpu_x=true"
    notes = " ".join(config["notes"])
    assert "extra_args replaces the generated per_device_batch_size=2" in notes
    assert "extra_env replaces the generated LIBTPU_INIT_ARGS" in notes
    # the JobSet's container runs the same args with the same env
    manifest = api.post(url, json={"target": "jobset", **extra}).json()["manifest"]
    container = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert container["command"][-3:] == extra["extra_args"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["WANDB_MODE"] == "offline"
    # every target: the per-process env target answers it for every process
    env_target = api.post(url, json={"target": "env", **extra}).json()["env"]
    assert env_target == {"DATARAX_PLAN_ID": plan["id"], **extra["extra_env"]}
    for bad in ({"extra_args": ["no-equals-sign"]}, {"extra_args": ["a=b\nc=d"]},
                {"extra_env": {"1BAD": "x"}}, {"command": ["python3", "-c", "x\x00y"]},
                {"image": "img\x00:1"}, {"name": "run\x00"},
                {"extra_env": {"A": "b\x00"}}):  # fmt: skip
        assert_problem(api.post(url, json={"target": "maxtext", **bad}), 422, "validation_error")


def test_slurm_is_for_gpu_plans(api):
    tpu = _plan(api, TPU_PLAN)
    problem = assert_problem(
        api.post(f"/v1/meshes/{tpu['id']}/launch", json={"target": "slurm"}),
        422,
        "launch_target_unavailable",
    )
    assert "jobset" in problem["detail"]
    gpu = _plan(api, GPU_PLAN)
    config = api.post(f"/v1/meshes/{gpu['id']}/launch", json={"target": "slurm"}).json()
    assert config["script"].startswith("#!/") and "--nodes=2" in config["script"]
    env = api.post(f"/v1/meshes/{gpu['id']}/launch", json={"target": "env"})
    assert env.status_code == 200 and env.json()["target"] == "env"


def test_a_plan_without_hardware_has_nothing_to_launch(api):
    plain = _plan(api, {"axes": {"data": -1}, "num_devices": 64})
    assert_problem(
        api.post(f"/v1/meshes/{plain['id']}/launch", json={"target": "maxtext"}),
        422,
        "launch_target_unavailable",
    )
    assert_problem(
        api.post("/v1/meshes/m_nope/launch", json={"target": "maxtext"}), 404, "mesh_not_found"
    )
    assert api.post(f"/v1/meshes/{plain['id']}/launch", json={"target": "helm"}).status_code == 422


def test_a_maxtext_config_is_a_plan_request(api):
    body = MAXTEXT_BODY
    plan = _plan(api, body)
    assert plan["axes"]["fsdp"] == 8 and set(plan["axes"]) >= {"data", "fsdp", "tensor"}
    assert plan["memory_per_device"]["fits"] is True
    assert plan["model"]["name"] == "llama3.1-8b" and plan["batch"]["shape"][0] == 24
    config = api.post(f"/v1/meshes/{plan['id']}/launch", json={"target": "maxtext"}).json()
    assert "ici_fsdp_parallelism=8" in config["args"]
    both = {**body, "ici": {"fsdp": 8}}
    assert api.post("/v1/meshes", json=both).status_code == 422


def test_a_queue_or_image_kubernetes_would_refuse_is_refused(api):
    plan = _plan(api, TPU_PLAN)
    for body in ({"target": "jobset", "queue": "q q"}, {"target": "jobset", "image": "a b"}):
        response = api.post(f"/v1/meshes/{plan['id']}/launch", json=body)
        assert response.status_code == 422, body
        assert response.headers["content-type"].startswith("application/problem+json")


def test_jobset_and_slurm_carry_the_new_kinds(api):
    # issue 38: a pipelined plan on 64 H100 hosts and an expert-parallel TPU plan launch
    # with MaxText's keys for their kinds, in every target that runs MaxText
    gpu = _plan(api, PIPELINED_GPU_PLAN)
    script = api.post(f"/v1/meshes/{gpu['id']}/launch", json={"target": "slurm"}).json()["script"]
    assert "--nodes=16" in script
    for key in ("dcn_pipeline_parallelism=4", "num_pipeline_microbatches=8",
                "num_layers_per_pipeline_stage=2"):  # fmt: skip
        assert key in script, key
    tpu = _plan(api, EXPERT_TPU_PLAN)
    body = {"target": "jobset", "image": "example.com/maxtext:1"}
    manifest = api.post(f"/v1/meshes/{tpu['id']}/launch", json=body).json()["manifest"]
    text = str(manifest)
    assert "ici_expert_parallelism=8" in text and "num_experts=8" in text


def test_an_image_not_given_is_a_warning(api):
    # issue 40: not a silent maxtext:latest; the maxtext target runs no image
    plan = _plan(api, TPU_PLAN)
    url = f"/v1/meshes/{plan['id']}/launch"
    config = api.post(url, json={"target": "jobset"}).json()
    (warning,) = config["warnings"]
    assert "no image was given" in warning and "'maxtext:latest'" in warning
    containers = config["manifest"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"][
        "spec"
    ]["containers"]
    assert containers[0]["image"] == "maxtext:latest"
    assert api.post(url, json={"target": "maxtext"}).json()["warnings"] == []


def test_a_launch_maxtext_would_refuse_is_not_launchable(api):
    # issue 56: 12 pipeline microbatches over 9 stages; MaxText needs a multiple of them
    plan = _plan(api, NINE_STAGE_PLAN)
    url = f"/v1/meshes/{plan['id']}/launch"
    problem = assert_problem(api.post(url, json={"target": "maxtext"}), 422, "not_launchable")
    assert "must be divisible by the number of stages (9)" in problem["detail"]
    assert "a multiple of the 9 stages (9, 18, 27 ...)" in problem["detail"]
    assert_problem(api.post(url, json={"target": "jobset"}), 422, "not_launchable")
    # no multiple of 9 divides its 96 sequences; extra_args MaxText accepts launch it
    assert "the 96 sequences now are no multiple of 9" in problem["detail"]
    assert_problem(api.post(url, json={"target": "maxtext", "extra_args": [
        "num_pipeline_microbatches=18"]}), 422, "not_launchable")  # fmt: skip
    fixed = {
        "target": "maxtext",
        "extra_args": ["per_device_batch_size=2", "num_pipeline_microbatches=18"],
    }
    assert api.post(url, json=fixed).status_code == 200
    # the env target runs no MaxText, so nothing to refuse
    assert api.post(url, json={"target": "env"}).status_code == 200
