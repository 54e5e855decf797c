"""MaxText's command line from a plan, and plans from MaxText's keys (launch_maxtext).

The round trip (MaxText keys -> plan request -> planner -> plan -> args -> parse -> plan)
is checked against MaxText's own ``create_device_mesh`` path through JAX's ``mesh_utils``
on the devices libtpu describes for each topology; without libtpu those cases skip
loudly (fail when ``CI=true``).
"""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

from app.schemas.meshes import MeshPlanRequest
from app.services.hardware import check_hardware_plan, hardware_plan_request, render_hardware_plan
from datarax.errors import PlanError
from datarax.hardware.topology import plan_hardware_devices
from datarax.launch.maxtext import (
    LIBTPU_INIT_ARGS,
    MAXTEXT_COMMIT,
    MAXTEXT_MESH_AXES,
    MAXTEXT_MODELS,
    XLA_FLAGS,
    maxtext_args,
    parse_maxtext_args,
    plan_request_from_maxtext,
)
from datarax.specs.model_specs import model_spec

_STEM = {axis: "pipeline" if axis == "stage" else axis for axis in MAXTEXT_MESH_AXES}


def _require_libtpu() -> None:
    if importlib.util.find_spec("libtpu") is None:
        message = (
            "libtpu is not installed: MaxText's device order over TPU topologies cannot be "
            "checked. Install it with `.venv/bin/pip install -c constraints.txt "
            "'jax[tpu]==0.12.0.1'`"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")


def _render(body: dict) -> dict:
    request = hardware_plan_request(MeshPlanRequest.model_validate(body))
    rendered = render_hardware_plan(
        check_hardware_plan(request), plan_id="m_test", created_at="2026-01-01T00:00:00Z"
    )
    return json.loads(getattr(rendered, "body", rendered))


def _layout(body: dict):
    return plan_hardware_devices(
        body["hardware"],
        ici=body["ici"],
        dcn=body["dcn"],
        topology=body.get("topology"),
        slices=body.get("slices", 1),
        hosts=body.get("hosts"),
        allow_split_physical_axes=body["allow_split_physical_axes"],
    )


def _maxtext_mesh(keys: dict, devices) -> np.ndarray:
    """What MaxText's maxtext_utils.create_device_mesh builds (commit MAXTEXT_COMMIT)."""
    from jax.experimental import mesh_utils  # noqa: PLC0415

    ici = [keys[f"ici_{_STEM[a]}_parallelism"] for a in MAXTEXT_MESH_AXES]
    dcn = [keys[f"dcn_{_STEM[a]}_parallelism"] for a in MAXTEXT_MESH_AXES]
    split = keys["allow_split_physical_axes"]
    if keys["num_slices"] > 1:
        return mesh_utils.create_hybrid_device_mesh(
            ici, dcn, devices, allow_split_physical_axes=split
        )
    if split:
        return mesh_utils.create_device_mesh(
            ici, devices, contiguous_submeshes=False, allow_split_physical_axes=split
        )
    return mesh_utils.create_device_mesh(ici, devices)


# (id, hardware, topology, slices, MaxText keys)
ROUND_TRIPS = [
    ("v5e-4x4-defaults", "tpu-v5e", "4x4", 1, {}),
    ("v5e-4x4-fsdp-tensor", "tpu-v5e", "4x4", 1, {"ici_fsdp_parallelism": 4,
                                                   "ici_tensor_parallelism": 4}),
    ("v5e-4x4-split", "tpu-v5e", "4x4", 1, {"ici_fsdp_parallelism": 8,
                                            "ici_tensor_parallelism": 2,
                                            "allow_split_physical_axes": True}),
    ("v6e-4x4-2-slices", "tpu-v6e", "4x4", 2, {"ici_fsdp_parallelism": 8,
                                               "ici_tensor_parallelism": 2,
                                               "allow_split_physical_axes": True}),
    ("v6e-2x4-4-slices", "tpu-v6e", "2x4", 4, {"dcn_data_parallelism": 2,
                                               "dcn_fsdp_parallelism": -1,
                                               "ici_fsdp_parallelism": 4,
                                               "ici_tensor_parallelism": 2}),
    ("v4-2x2x2", "tpu-v4", "2x2x2", 1, {"ici_fsdp_parallelism": 4,
                                        "ici_tensor_parallelism": 2}),
    ("v4-4x4x4-fsdp-transpose", "tpu-v4", "4x4x4", 1, {"ici_fsdp_parallelism": -1,
                                                       "ici_fsdp_transpose_parallelism": 4,
                                                       "ici_tensor_parallelism": 4}),
    ("v5p-2x2x4-2-slices", "tpu-v5p", "2x2x4", 2, {"ici_fsdp_parallelism": 8,
                                                   "ici_tensor_parallelism": 2}),
    ("v5p-4x4x4-3-slices-split", "tpu-v5p", "4x4x4", 3, {"ici_data_parallelism": 2,
                                                         "ici_fsdp_parallelism": 8,
                                                         "ici_tensor_parallelism": 4,
                                                         "allow_split_physical_axes": True}),
    ("v5e-2x2-named-model", "tpu-v5e", "2x2", 1, {"model_name": "llama3.1-8b",
                                                  "per_device_batch_size": 1,
                                                  "remat_policy": "full"}),
    ("v5p-2x4x4-expert-moe", "tpu-v5p", "2x4x4", 1, {"model_name": "mixtral-8x7b",
                                                     "ici_fsdp_parallelism": 4,
                                                     "ici_expert_parallelism": 8,
                                                     "per_device_batch_size": 1}),
    ("v5p-2x4x4-tensor-sequence", "tpu-v5p", "2x4x4", 1, {"model_name": "llama3.1-8b",
                                                         "ici_fsdp_parallelism": 8,
                                                         "ici_tensor_sequence_parallelism": 4,
                                                         "per_device_batch_size": 1}),
    ("v5p-4x4x4-stage-context", "tpu-v5p", "4x4x4", 1, {"model_name": "llama3.1-8b",
                                                        "ici_pipeline_parallelism": 4,
                                                        "ici_context_parallelism": 4,
                                                        "ici_fsdp_parallelism": 4,
                                                        "num_pipeline_microbatches": 8,
                                                        "context_parallel_strategy": "ring",
                                                        "shard_optimizer_over_data": True,
                                                        "per_device_batch_size": 1}),
    ("v5p-2x2x4-2-slices-dcn-expert", "tpu-v5p", "2x2x4", 2, {"dcn_expert_parallelism": 2,
                                                              "dcn_data_parallelism": 1,
                                                              "ici_expert_parallelism": 4,
                                                              "ici_fsdp_parallelism": 4}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("hardware", "topology", "slices", "keys"),
    [case[1:] for case in ROUND_TRIPS],
    ids=[case[0] for case in ROUND_TRIPS],
)
def test_round_trip_matches_maxtexts_device_mesh(hardware, topology, slices, keys):
    _require_libtpu()
    from datarax.spmd.compile_step import tpu_topology_devices  # noqa: PLC0415

    body = plan_request_from_maxtext(keys, hardware=hardware, topology=topology, slices=slices)
    assert list(body["ici"]) == list(MAXTEXT_MESH_AXES) == list(body["dcn"])
    first = _layout(body)
    plan = _render(body)
    assert plan["device_grid"] == first.device_grid.tolist()
    out = maxtext_args(plan)
    parsed = parse_maxtext_args(out["args"])
    again_body = plan_request_from_maxtext(
        parsed, hardware=hardware, topology=topology, slices=slices
    )
    again = _layout(again_body)
    np.testing.assert_array_equal(again.device_ids, first.device_ids)
    devices = tpu_topology_devices(hardware, topology, slices)
    mesh = _maxtext_mesh(parsed, devices)
    assert mesh.shape == tuple(first.axes.values())
    np.testing.assert_array_equal(first.device_ids, [d.id for d in mesh.flat])
    # MaxText's own order needs no note about axis order
    assert not [n for n in out["notes"] if "fixed order" in n]


def _v5e_plan(ici: dict, dcn: dict | None = None, slices: int = 1, **extra) -> dict:
    body = {"hardware": "tpu-v5e", "topology": "4x4", "slices": slices, "ici": ici, **extra}
    if dcn is not None:
        body["dcn"] = dcn
    return _render(body)


def test_every_mesh_axis_key_present_one_where_unused():
    out = maxtext_args(_v5e_plan({"data": -1, "tensor": 4}, {"data": 2}, slices=2))
    parsed = parse_maxtext_args(out["args"])
    for axis in MAXTEXT_MESH_AXES:
        for net in ("ici", "dcn"):
            assert f"{net}_{_STEM[axis]}_parallelism" in parsed
    expected = {"ici_data_parallelism": 4, "ici_tensor_parallelism": 4, "dcn_data_parallelism": 2}
    for key, value in parsed.items():
        if key.endswith("_parallelism"):
            assert value == expected.get(key, 1), key
    assert parsed["num_slices"] == 2 and parsed["allow_split_physical_axes"] is False
    assert parsed["ici_pipeline_parallelism"] == 1  # MaxText's key for axis 'stage'
    assert out["notes"] == []


def test_reordered_axes_note_says_what_changes():
    out = maxtext_args(_v5e_plan({"tensor": 4, "data": -1}))
    parsed = parse_maxtext_args(out["args"])
    assert parsed["ici_tensor_parallelism"] == 4 and parsed["ici_data_parallelism"] == 4
    (note,) = [n for n in out["notes"] if "fixed order" in n]
    assert "['tensor', 'data']" in note and "['data', 'tensor']" in note


def test_two_axes_with_one_role_are_folded_with_a_note():
    out = maxtext_args(
        _v5e_plan({"replica": 2, "data": 2, "tensor": 4}, allow_split_physical_axes=True)
    )
    parsed = parse_maxtext_args(out["args"])
    assert parsed["ici_data_parallelism"] == 4 and parsed["ici_tensor_parallelism"] == 4
    assert any("folded" in n and "'replica'" in n for n in out["notes"])


def test_axis_without_a_maxtext_name_is_refused_or_dropped():
    plan = _v5e_plan({"data": 16, "pipe": 1})
    out = maxtext_args(plan)
    assert any("'pipe' (size 1)" in n for n in out["notes"])
    with pytest.raises(PlanError) as error:
        maxtext_args(_v5e_plan({"data": 4, "pipe": 4}))
    assert error.value.code == "launch_target_unavailable" and "'pipe'" in error.value.message
    with pytest.raises(PlanError) as error:
        maxtext_args({"axes": {"data": 8}})
    assert error.value.code == "launch_target_unavailable"


# Plans whose launches these tests write (tests/datarax/launch/test_maxtext_accepts.py has
# MaxText's own checks judge each).
NAMED_MODEL_PLAN = {
    "hardware": "tpu-v5e",
    "topology": "4x4",
    "ici": {"fsdp": -1},
    "batch_shape": [32, 8192],
    "model": {"name": "llama3.1-8b", "remat": "save_qkv_proj", "param_dtype": "float32"},
}
MOE_MLA_PLAN = {
    "hardware": "tpu-v5p",
    "topology": "4x4x8",
    "ici": {"fsdp": 16, "expert": 8},
    "batch_shape": [128, 4096],
    "model": {"name": "deepseek3-671b", "capacity_factor": 1.25, "moe_kernel": "dense"},
}
# MaxText 0.2.5 refuses its launch: ZeRO-1 beside fsdp (the args are still MaxText's keys)
PIPELINE_CONTEXT_ZERO1_PLAN = {
    "hardware": "tpu-v5p", "topology": "4x4x4", "ici": {"stage": 4, "fsdp": 4, "context": 4},
    "batch_shape": [64, 8192], "model": {"name": "llama3.1-8b", "remat": "full"},
    "pipeline": {"microbatches": 8, "layers_per_stage": 2, "schedule": "circular"},
    "context_parallel": {"strategy": "ring", "load_balance": False},
    "optimizer": {"name": "adamw", "shard_over_data": True},
}  # fmt: skip
GEMMA_OVERRIDE_PLAN = {
    "hardware": "tpu-v5e",
    "topology": "2x2",
    "ici": {"fsdp": 2, "tensor": 2},
    "batch_shape": [2, 4096],
    "model": {"name": "gemma2-9b", "layers": 10, "attention": "dot"},
}
CUSTOM_REMAT_PLAN = {
    "hardware": "h100-sxm", "hosts": 2, "ici": {"fsdp": 8}, "dcn": {"fsdp": 2},
    "batch_shape": [16, 128],
    "model": {"kind": "transformer", "layers": 2, "d_model": 256, "d_ff": 1024, "heads": 4,
              "kv_heads": 2, "vocab": 1000, "seq_len": 128, "mlp": "plain", "remat": "custom",
              "remat_custom": {"decoder_layer_input": "offload", "mlpwo": "device"}},
}  # fmt: skip


def test_named_model_keys_use_maxtexts_own_values():
    plan = _render(NAMED_MODEL_PLAN)
    plan["optimizer"] = "adamw"  # a stored plan's optimizer name, when it has one
    parsed = parse_maxtext_args(maxtext_args(plan)["args"])
    entry = MAXTEXT_MODELS["llama3.1-8b"]
    assert parsed["model_name"] == "llama3.1-8b" and "override_model_config" not in parsed
    for key in ("base_emb_dim", "base_num_query_heads", "base_num_kv_heads", "base_mlp_dim"):
        assert parsed[key] == entry[key]
    assert parsed["base_num_decoder_layers"] == 32 and parsed["head_dim"] == 128
    assert parsed["vocab_size"] == 128256 and parsed["mlp_activations"] == ["silu", "linear"]
    assert parsed["logits_via_embedding"] is False
    assert parsed["weight_dtype"] == "float32" and parsed["dtype"] == "bfloat16"
    assert parsed["remat_policy"] == "save_qkv_proj" and parsed["attention"] == "flash"
    assert parsed["num_vocab_tiling"] == 1 and parsed["max_target_length"] == 8192
    assert parsed["per_device_batch_size"] == 2 and parsed["opt_type"] == "adamw"


def test_moe_and_mla_keys_are_written_and_read_back():
    body = MOE_MLA_PLAN
    out = maxtext_args(_render(body))
    parsed = parse_maxtext_args(out["args"])
    assert parsed["model_name"] == "deepseek3-671b" and "override_model_config" not in parsed
    assert parsed["ici_expert_parallelism"] == 8 and parsed["ici_fsdp_parallelism"] == 16
    assert (parsed["num_experts"], parsed["num_experts_per_tok"], parsed["shared_experts"]) == (
        256, 8, 1)  # fmt: skip
    assert parsed["base_moe_mlp_dim"] == 2048 and parsed["first_num_dense_layers"] == 3
    assert parsed["capacity_factor"] == 1.25 and parsed["sparse_matmul"] is False
    assert parsed["attention_type"] == "mla" and parsed["q_lora_rank"] == 1536
    assert "head_dim" not in parsed  # MLA's head widths are its own keys
    notes: list[str] = []
    again = plan_request_from_maxtext(parsed, hardware="tpu-v5p", topology="4x4x8", notes=notes)
    assert again["model"]["capacity_factor"] == 1.25 and again["model"]["moe_kernel"] == "dense"
    assert again["ici"]["expert"] == 8
    assert model_spec(again["model"]) == model_spec(body["model"])
    # a MaxText model given by its keys alone: an MoE with MLA, base.yml's MLA defaults
    keys = {"base_emb_dim": 1024, "base_num_query_heads": 8, "base_num_kv_heads": 8,
            "base_mlp_dim": 2048, "base_num_decoder_layers": 4, "num_experts": 16,
            "num_experts_per_tok": 2, "base_moe_mlp_dim": 512, "interleave_moe_layer_step": 2,
            "attention_type": "mla"}  # fmt: skip
    model = plan_request_from_maxtext(keys, hardware="tpu-v5p", topology="2x2x1")["model"]
    spec = model_spec(model)
    assert (spec.num_experts, spec.experts_per_token, spec.moe_d_ff, spec.moe_every) == (
        16, 2, 512, 2)  # fmt: skip
    assert spec.dropless and spec.moe_kernel == "sparse"
    assert (spec.kv_lora_rank, spec.qk_nope_head_dim, spec.q_lora_rank) == (512, 128, 0)
    # one routed expert is a dense model: MaxText reads no MoE key then
    notes = []
    dense = plan_request_from_maxtext(
        {**keys, "num_experts": 1, "attention_type": "global"},
        hardware="tpu-v5p", topology="2x2x1", notes=notes,
    )  # fmt: skip
    assert not model_spec(dense["model"]).is_moe
    assert any("a dense model" in n for n in notes)


def test_pipeline_context_and_zero1_are_written_and_read_back():
    body = dict(PIPELINE_CONTEXT_ZERO1_PLAN)
    out = maxtext_args(_render(body))
    parsed = parse_maxtext_args(out["args"])
    assert parsed["ici_pipeline_parallelism"] == 4 and parsed["ici_context_parallelism"] == 4
    assert parsed["num_pipeline_microbatches"] == 8
    assert parsed["num_layers_per_pipeline_stage"] == 2
    assert parsed["context_parallel_strategy"] == "ring"
    assert parsed["context_parallel_load_balance"] is False
    assert parsed["shard_optimizer_over_data"] is True
    again = plan_request_from_maxtext(parsed, hardware="tpu-v5p", topology="4x4x4")
    assert again["pipeline"] == {"schedule": "circular", "layers_per_stage": 2, "microbatches": 8}
    assert again["context_parallel"] == {"strategy": "ring", "load_balance": False}
    assert again["optimizer"]["shard_over_data"] is True
    first = _render(body)["step_estimate"]
    second = _render(again)["step_estimate"]
    assert second["pipeline"] == first["pipeline"]
    assert second["step_s"] == pytest.approx(first["step_s"])
    # a 1f1b plan says MaxText runs its own schedule
    body["pipeline"] = {"microbatches": 8, "schedule": "1f1b"}
    assert any("circular" in note for note in maxtext_args(_render(body))["notes"])


def test_named_model_overridden_sets_override_model_config():
    out = maxtext_args(_render(GEMMA_OVERRIDE_PLAN))
    parsed = parse_maxtext_args(out["args"])
    assert parsed["override_model_config"] is True
    assert parsed["base_num_decoder_layers"] == 5  # pairs of (local, global) layers
    assert parsed["mlp_activations"] == ["gelu", "linear"]
    assert parsed["attention"] == "dot_product" and parsed["per_device_batch_size"] == 0.5


def test_custom_remat_writes_maxtexts_per_tensor_keys():
    plan = _render(CUSTOM_REMAT_PLAN)
    out = maxtext_args(plan)
    parsed = parse_maxtext_args(out["args"])
    assert parsed["remat_policy"] == "custom" and "model_name" not in parsed
    assert parsed["decoder_layer_input"] == "offload" and parsed["mlpwo"] == "device"
    assert parsed["query_proj"] == "remat" and parsed["mlp_activations"] == ["gelu"]
    assert parsed["head_dim"] == 64 and parsed["attention"] == "cudnn_flash_te"
    assert parsed["num_slices"] == 2 and parsed["dcn_fsdp_parallelism"] == 2
    assert parsed["hardware"] == "gpu" and parsed["per_device_batch_size"] == 1
    # and back: the same model, with MaxText's names for the axes
    body = plan_request_from_maxtext(parsed, hardware="h100-sxm", hosts=2)
    assert body["model"]["remat_custom"]["decoder_layer_input"] == "offload"
    assert body["model"]["mlp"] == "plain" and body["model"]["layers"] == 2
    assert body["batch_shape"] == [16, 128]
    np.testing.assert_array_equal(_layout(body).device_ids, np.asarray(plan["device_grid"]).ravel())


ENV_CASES = [(hw, "LIBTPU_INIT_ARGS", "/configs/tpu/") for hw in LIBTPU_INIT_ARGS] + [
    (hw, "XLA_FLAGS", "/configs/gpu/") for hw in XLA_FLAGS
]


@pytest.mark.parametrize(("hardware", "var", "where"), ENV_CASES, ids=[c[0] for c in ENV_CASES])
def test_env_per_generation_carries_its_source(hardware, var, where):
    if var == "LIBTPU_INIT_ARGS":
        topology = {"tpu-v4": "2x2x1", "tpu-v5p": "2x2x1"}.get(hardware, "2x2")
        plan = _render({"hardware": hardware, "topology": topology, "ici": {"data": -1}})
    else:
        hosts = 18 if hardware == "gb200-nvl72" else 1
        plan = _render({"hardware": hardware, "hosts": hosts, "ici": {"data": -1}})
    out = maxtext_args(plan)
    assert list(out["env"]) == [var] == list(out["env_sources"])
    assert out["env_sources"][var].startswith(
        f"https://github.com/AI-Hypercomputer/maxtext/blob/{MAXTEXT_COMMIT}/"
    )
    assert where in out["env_sources"][var]
    assert "--xla_enable_async_all_gather=true" in out["env"][var] or var == "XLA_FLAGS"
    if var == "XLA_FLAGS":
        assert "--xla_gpu_enable_latency_hiding_scheduler=true" in out["env"][var]
        assert "xla_dump_to" not in out["env"][var]


@pytest.mark.parametrize("hardware", ["tpu-v5p", "tpu-v6e", "tpu-v5e"])
def test_flags_the_pinned_libtpu_refuses_are_left_out_and_said(hardware):
    # libtpu 0.0.50.1 refuses this flag when it compiles MaxText's step for anything but a
    # v5e ("Continuation fusion for AllGather ... not supported on platforms other than
    # TPU v5e"): a launch carrying it would not start
    flag = "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true"
    topology = "2x2x1" if hardware == "tpu-v5p" else "2x2"
    out = maxtext_args(_render({"hardware": hardware, "topology": topology, "ici": {"data": -1}}))
    said = [n for n in out["notes"] if flag in n]
    if hardware == "tpu-v5e":
        assert flag in out["env"]["LIBTPU_INIT_ARGS"].split() and not said
    else:
        assert flag not in out["env"]["LIBTPU_INIT_ARGS"].split()
        assert len(said) == 1 and "libtpu 0.0.50.1" in said[0]
