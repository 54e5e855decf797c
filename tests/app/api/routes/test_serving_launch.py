"""Launching serving plans over HTTP (issue 57 item 4, DESIGN v1.4 "Serving plans"):
``vllm`` (the ``vllm serve`` command line, every flag and value checked against vLLM's
argument parser at the commits :mod:`datarax.launch.serving` cites), ``jetstream``
(MaxText's serving keys, judged by MaxText's own ``pyconfig``), ``jobset`` (valid against
the JobSet schema and Kubernetes' own), and the refusals."""

from __future__ import annotations

import shlex

import pytest

from datarax.answers.launch import JetStreamLaunch, LaunchConfig, VllmLaunch
from datarax.launch.serving import (
    HF_MODELS,
    VLLM_FLAGS,
    VLLM_KV_CACHE_DTYPES,
    VLLM_QUANTIZATION,
    VLLM_SWITCHES,
)
from datarax.specs.named_models import MODELS
from tests.datarax.launch.test_k8s import (
    assert_valid_core,
    assert_valid_jobset,
    assert_webhook_rules,
    jobset_validator,  # noqa: F401 (the fixture)
)
from tests.helpers import assert_problem
from tests.maxtext_judge import maxtext_verdicts

SERVING = {"input_tokens": 1000, "output_tokens": 1000, "concurrency": 64}
TPU_70B = {"hardware": "tpu-v6e", "topology": "2x4", "ici": {"tensor": 8},
           "model": {"name": "llama3.1-70b"},
           "serving": {**SERVING, "weight_dtype": "int8", "kv_dtype": "int8",
                       "engine": "jetstream"}}  # fmt: skip
TPU_8B = {"hardware": "tpu-v5e", "topology": "2x4", "ici": {"data": 2, "tensor": 4},
          "model": {"name": "llama3.1-8b"}, "serving": SERVING}  # fmt: skip
GPU_MOE = {"hardware": "h100-sxm", "hosts": 2, "ici": {"data": 2, "expert": 2, "tensor": 2},
           "dcn": {"data": 2}, "model": {"name": "mixtral-8x7b"},
           "serving": {**SERVING, "weight_dtype": "float8", "kv_dtype": "float8",
                       "memory_fraction": 0.85}}  # fmt: skip
GPU_405B = {"hardware": "h100-sxm", "hosts": 2, "ici": {"tensor": 8, "stage": 1},
            "dcn": {"stage": 2}, "model": {"name": "llama3.1-405b"},
            "serving": {**SERVING, "weight_dtype": "float8", "kv_dtype": "float8"}}  # fmt: skip


def _plan(api, body):
    response = api.post("/v1/meshes", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def _launch(api, plan, body):
    response = api.post(f"/v1/meshes/{plan['id']}/launch", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def _flags(args: list[str]) -> dict[str, str | None]:
    """``vllm serve``'s flags as vLLM's argparse reads them; each flag in vLLM's list and
    each value of its accepted type or choices."""
    out: dict[str, str | None] = {}
    i = 0
    while i < len(args):
        flag = args[i]
        assert flag in VLLM_FLAGS, f"{flag} is not a vllm serve flag"
        if flag not in VLLM_SWITCHES:
            out[flag], i = args[i + 1], i + 2
        else:
            out[flag], i = None, i + 1
    for flag in ("--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size",
                 "--max-model-len", "--max-num-seqs"):  # fmt: skip
        assert flag not in out or int(out[flag] or "") >= 1
    assert 0 < float(out["--gpu-memory-utilization"] or "") <= 1  # CacheConfig: gt=0, le=1
    assert out["--kv-cache-dtype"] in VLLM_KV_CACHE_DTYPES
    assert out.get("--quantization", "fp8") in VLLM_QUANTIZATION
    assert out.get("--distributed-executor-backend", "ray") in ("ray", "mp")
    return out


def test_every_named_model_with_weights_has_a_hugging_face_id():
    assert set(HF_MODELS) == set(MODELS) - {"gpt3-175b"}
    assert all(repo.count("/") == 1 and " " not in repo for repo in HF_MODELS.values())


def test_vllm_on_a_gpu_moe_plan(api):
    plan = _plan(api, GPU_MOE)
    config = _launch(api, plan, {"target": "vllm", "extra_env": {"HF_TOKEN": "t"}})
    assert isinstance(LaunchConfig.from_json(config), VllmLaunch)
    flags = _flags(config["args"])
    # one server a host: 2 replicas of expert 2 x tensor 2 on each 8-GPU host
    assert config["servers"] == 2 and config["hosts_per_server"] == 1
    assert flags["--tensor-parallel-size"] == "2" and flags["--data-parallel-size"] == "4"
    assert "--enable-expert-parallel" in flags and flags["--pipeline-parallel-size"] == "1"
    assert flags["--max-model-len"] == "2000"
    assert flags["--max-num-seqs"] == str(plan["serving_estimate"]["batch"])
    assert flags["--gpu-memory-utilization"] == "0.85"
    assert flags["--kv-cache-dtype"] == "fp8" and flags["--quantization"] == "fp8"
    assert config["model"] == "mistralai/Mixtral-8x7B-Instruct-v0.1"
    assert config["command"] == ["vllm", "serve", config["model"], *config["args"]]
    assert config["env"] == {"DATARAX_PLAN_ID": plan["id"], "HF_TOKEN": "t"}
    assert config["flag_source"].startswith("https://github.com/vllm-project/vllm/blob/")


def test_vllm_on_a_tpu_plan_and_extra_flags(api):
    plan = _plan(api, TPU_8B)
    body = {"target": "vllm", "extra_args": ["max_num_batched_tokens=8192", "max_num_seqs=32"]}
    config = _launch(api, plan, body)
    flags = _flags(config["args"])
    assert flags["--tensor-parallel-size"] == "4" and flags["--kv-cache-dtype"] == "auto"
    assert "--quantization" not in flags and "--enable-expert-parallel" not in flags
    assert flags["--max-num-seqs"] == "32" and flags["--max-num-batched-tokens"] == "8192"
    assert any("replaces the generated --max-num-seqs" in n for n in config["notes"])
    for extra, words in (("max_num_sequences=4", "--max-num-sequences is not"),
                         ("enable_prefix_caching=no", "is a switch"),
                         ("max_model_len=", "takes a value")):  # fmt: skip
        bad = {"target": "vllm", "extra_args": [extra]}
        response = api.post(f"/v1/meshes/{plan['id']}/launch", json=bad)
        assert words in assert_problem(response, 422, "invalid_request")["detail"]
    switched = _launch(api, plan, {"target": "vllm", "extra_args": ["enable_prefix_caching=true"]})
    assert _flags(switched["args"])["--enable-prefix-caching"] is None


def test_vllm_int_weights_warn_and_int8_kv_is_refused(api):
    plan = _plan(api, TPU_70B)
    response = api.post(f"/v1/meshes/{plan['id']}/launch", json={"target": "vllm"})
    problem = assert_problem(response, 422, "launch_target_unavailable")
    assert "int8" in problem["detail"] and "jetstream" in problem["detail"]
    int4 = _plan(api, {**TPU_8B, "serving": {**SERVING, "weight_dtype": "int4"}})
    config = _launch(api, int4, {"target": "vllm"})
    assert _flags(config["args"])["--quantization"] == "awq"
    assert any("AWQ checkpoint" in w for w in config["warnings"])


def test_jetstream_on_tpu_is_what_maxtext_accepts(api):
    plan = _plan(api, TPU_70B)
    config = _launch(api, plan, {"target": "jetstream",
                                 "extra_args": ["load_parameters_path=gs://b/ckpt"]})  # fmt: skip
    assert isinstance(LaunchConfig.from_json(config), JetStreamLaunch)
    args = dict(a.split("=", 1) for a in config["args"])
    assert args["ici_tensor_parallelism"] == "8" and args["model_name"] == "llama3.1-70b"
    assert args["max_prefill_predict_length"] == "1000" and args["max_target_length"] == "2000"
    assert float(args["per_device_batch_size"]) * 8 == plan["serving_estimate"]["batch"]
    assert args["quantization"] == "int8" and args["quantize_kvcache"] == "true"
    assert args["kv_quant_dtype"] == "int8" and "remat_policy" not in args
    assert config["command"][2] == "maxtext.inference.maxengine.maxengine_server"
    assert config["warnings"] == []
    bogus = [*config["args"], "quantization=int2"]
    verdicts = maxtext_verdicts(
        [{"args": config["args"], "devices": 8}, {"args": bogus, "devices": 8}]
    )
    assert verdicts[0]["refusal"] is None, verdicts[0]["refusal"]
    assert verdicts[0]["batch"] == plan["serving_estimate"]["batch"]
    assert "quantization" in verdicts[1]["refusal"]  # the judge can refuse


def test_jetstream_is_refused_where_it_does_not_serve(api):
    for body, words in (
        (GPU_MOE, "jetstream serves on TPUs"),
        ({**TPU_8B, "serving": {**SERVING, "kv_dtype": "float8"}}, "fp8"),
    ):
        plan = _plan(api, body)
        response = api.post(f"/v1/meshes/{plan['id']}/launch", json={"target": "jetstream"})
        problem = assert_problem(response, 422, "launch_target_unavailable")
        assert words in problem["detail"]


@pytest.mark.parametrize(
    ("body", "engine"),
    [(GPU_MOE, "vllm"), (GPU_405B, "ray"), (TPU_8B, "vllm"), (TPU_70B, "jetstream")],  # fmt: skip
)
def test_a_serving_jobset_is_a_valid_manifest(api, jobset_validator, body, engine):  # noqa: F811
    plan = _plan(api, body)
    config = _launch(api, plan, {"target": "jobset", "image": "example.com/serve:1"})
    manifest = config["manifest"]
    assert_valid_jobset(jobset_validator, manifest)
    assert_valid_core(manifest)
    assert_webhook_rules(manifest)
    (job,) = manifest["spec"]["replicatedJobs"]
    (container,) = job["template"]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "example.com/serve:1"
    command = container["command"]
    if engine == "jetstream":
        assert command[2] == "maxtext.inference.maxengine.maxengine_server"
        assert {"containerPort": 9000} in container["ports"]
        return
    assert {"containerPort": 8000} in container["ports"]
    if engine == "ray":
        assert command[:2] == ["bash", "-c"] and "ray start --head" in command[2]
        serve = shlex.split(command[2].split("exec ", 1)[1].split(";")[0])
        assert _flags(serve[3:])["--distributed-executor-backend"] == "ray"
        assert _flags(serve[3:])["--pipeline-parallel-size"] == "2"
    else:
        assert command[:2] == ["vllm", "serve"]
        _flags(command[3:])


def test_training_targets_stay_refused_and_vllm_needs_a_serving_plan(api):
    plan = _plan(api, TPU_8B)
    for target in ("maxtext", "slurm"):
        response = api.post(f"/v1/meshes/{plan['id']}/launch", json={"target": target})
        problem = assert_problem(response, 422, "launch_target_unavailable")
        assert "serving plan" in problem["detail"]
    training = _plan(api, {"hardware": "tpu-v5e", "topology": "2x2", "ici": {"data": 4}})
    for target in ("vllm", "jetstream"):
        response = api.post(f"/v1/meshes/{training['id']}/launch", json={"target": target})
        problem = assert_problem(response, 422, "launch_target_unavailable")
        assert "training step" in problem["detail"]


def test_jetstream_refuses_a_mixture_maxtext_would_build_dense(api):
    # grouped-query attention with a shared expert: MaxText 0.2.5 has no block for it but
    # its named models' (base.yml's llama2 block would serve a dense model)
    model = {
        "kind": "transformer",
        "layers": 4,
        "d_model": 512,
        "d_ff": 1024,
        "heads": 8,
        "kv_heads": 8,
        "head_dim": 64,
        "vocab": 32000,
        "seq_len": 2048,
        "num_experts": 8,
        "experts_per_token": 2,
        "moe_d_ff": 512,
        "shared_experts": 1,
    }
    plan = _plan(api, {**TPU_8B, "model": model,
                       "serving": {**SERVING, "engine": "jetstream"}})  # fmt: skip
    response = api.post(f"/v1/meshes/{plan['id']}/launch", json={"target": "jetstream"})
    problem = assert_problem(response, 422, "not_launchable")
    assert "would build the model dense" in problem["detail"]
