"""Hardware catalog and hardware plans over HTTP (in-process app); recommendations in
``test_recommendations.py``, the named models' catalog in ``test_models.py``."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from datarax.answers.catalog import HardwareEntry, HardwareList
from datarax.hardware.chips import HARDWARE
from datarax.hardware.topology import plan_hardware_devices
from datarax.plan.layout import batch_partition_spec, shard_index_ranges
from tests.helpers import assert_problem

DESIGN_NAMES = {
    "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e",
    "h100-sxm", "h200-sxm", "b200", "gb200-nvl72", "cpu",
}  # fmt: skip
DESIGN_FIELDS = (
    "name", "kind", "device_kind", "hbm_bytes", "peak_bf16_flops", "devices_per_host",
    "fast_domain_devices", "fast_link_bytes_per_s", "slow_link_bytes_per_s", "topologies",
    "sources",
)  # fmt: skip
FIGURES = ("hbm_bytes", "peak_bf16_flops", "fast_link_bytes_per_s", "slow_link_bytes_per_s")

TRANSFORMER = {
    "kind": "transformer", "layers": 4, "d_model": 1024, "d_ff": 4096, "heads": 16,
    "kv_heads": 16, "vocab": 32000, "seq_len": 2048,
}  # fmt: skip

V5E_TWO_SLICES = {
    "hardware": "tpu-v5e",
    "topology": "16x16",
    "slices": 2,
    "ici": {"data": 1, "fsdp": 16, "tensor": 16},
    "dcn": {"data": -1},
    "batch_shape": [1024, 2048],
    "batch_axes": ["data", "fsdp"],
}


def test_catalog_lists_design_entries_with_sources(api):
    response = api.get("/v1/hardware")
    assert response.status_code == 200
    items = response.json()["items"]
    # DESIGN names these entries at least; the catalog adds A100 and V100 (device_placement's
    # chips, now read from the one catalog).
    names = [item["name"] for item in items]
    assert len(names) == len(set(names)) == len(HARDWARE)
    assert DESIGN_NAMES <= set(names) == set(HARDWARE)
    for item in items:
        missing = [key for key in DESIGN_FIELDS if key not in item]
        assert not missing, (item["name"], missing)
        assert item["kind"] in ("tpu", "gpu", "cpu")
        assert item["sources"] and all(isinstance(v, str) and v for v in item["sources"].values())
        if item["kind"] == "tpu":
            assert item["topologies"], item["name"]
            unsourced = [f for f in FIGURES if not any(k.startswith(f) for k in item["sources"])]
            assert not unsourced, (item["name"], unsourced, list(item["sources"]))
    one = api.get("/v1/hardware/tpu-v5p")
    assert one.status_code == 200
    assert one.json() == HARDWARE["tpu-v5p"].to_json()
    assert one.json()["peak_bf16_flops"] == 4.59e14
    # the answer is the entry's class: parsed back, the same members in the same order
    parsed = HardwareList.from_json(response.json())
    assert all(isinstance(item, HardwareEntry) for item in parsed.items)
    assert parsed.to_json() == response.json()
    assert list(one.json()) == [f.name for f in dataclasses.fields(HardwareEntry)]


def test_unknown_hardware_name_is_404(api):
    body = assert_problem(api.get("/v1/hardware/tpu-v9"), 404, "hardware_not_found")
    assert "tpu-v5e" in body["detail"]


def test_v5e_two_slices_plan_matches_the_planner(api):
    response = api.post("/v1/meshes", json=V5E_TWO_SLICES)
    assert response.status_code == 201, response.text
    plan = response.json()
    assert plan["live"] is False and plan["platform"] == "tpu"
    assert plan["axes"] == {"data": 2, "fsdp": 16, "tensor": 16}
    assert plan["total_devices"] == 512 == len(plan["shards"])
    layout = plan_hardware_devices(
        "tpu-v5e", topology="16x16", slices=2, ici=V5E_TWO_SLICES["ici"], dcn={"data": -1}
    )
    assert plan["device_grid"] == layout.device_grid.tolist()
    assert [s["device"] for s in plan["shards"]] == layout.device_ids.tolist()
    assert [s["slice"] for s in plan["shards"]] == layout.slice_index.tolist()
    assert [s["host"] for s in plan["shards"]] == layout.host_index.tolist()
    assert [s["physical"] for s in plan["shards"]] == layout.physical.tolist()
    assert all(s["core"] == 0 for s in plan["shards"])
    assert {s["slice"] for s in plan["shards"]} == {0, 1}
    assert plan["axes_detail"] == [link.to_json() for link in layout.axes_detail]
    assert [(a["name"], a["link"]) for a in plan["axes_detail"]] == [
        ("data", "dcn"), ("fsdp", "ici"), ("tensor", "ici"),
    ]  # fmt: skip
    # batch ranges: shard_index_ranges over the layout's axes in device_grid order
    spec = batch_partition_spec(layout.axes, ["data", "fsdp"], 2)
    ranges = shard_index_ranges(layout.axes, spec, [1024, 2048])
    assert [s["index"] for s in plan["shards"]] == ranges.tolist()
    assert plan["batch"]["shard_shape"] == [32, 2048]
    assert "step_estimate" not in plan
    # stored and served again byte for byte
    again = api.get(f"/v1/meshes/{plan['id']}")
    assert again.status_code == 200 and again.content == response.content


def test_h100_plan_with_hosts(api):
    body = {
        "hardware": "h100-sxm",
        "hosts": 4,
        "ici": {"fsdp": 2, "tensor": 4},
        "dcn": {"fsdp": -1},
        "batch_shape": [64, 16],
        "batch_axes": ["fsdp"],
    }
    response = api.post("/v1/meshes", json=body)
    assert response.status_code == 201, response.text
    plan = response.json()
    assert plan["platform"] == "gpu" and plan["axes"] == {"fsdp": 8, "tensor": 4}
    layout = plan_hardware_devices("h100-sxm", hosts=4, ici=body["ici"], dcn=body["dcn"])
    assert plan["device_grid"] == layout.device_grid.tolist()
    shards = plan["shards"]
    assert [s["host"] for s in shards] == layout.host_index.tolist()
    assert [s["physical"] for s in shards] == layout.physical.tolist()
    assert all("core" not in s for s in shards)
    # the tensor axis (innermost ici) stays inside one host's NVLink domain
    grid = np.asarray(plan["device_grid"])
    assert all(len({int(d) // 8 for d in row}) == 1 for row in grid)
    assert [a["link"] for a in plan["axes_detail"]] == ["infiniband", "nvlink"]
    assert plan["hosts"] == 4 and plan["hardware"] == "h100-sxm"


def test_an_accelerator_type_names_the_slice_and_the_answer_gives_its_shape(api):
    body = {"hardware": "tpu-v5p", "topology": "v5p-512", "ici": {"fsdp": -1}}
    response = api.post("/v1/meshes", json=body)
    assert response.status_code == 201, response.text
    plan = response.json()
    assert plan["topology"] == "v5p:4x8x8" and plan["axes"] == {"fsdp": 256}
    wrong = api.post("/v1/meshes", json={**body, "topology": "v5p-500"})
    assert wrong.status_code == 422 and wrong.json()["code"] == "invalid_topology"
    assert "v5p-N for N in" in wrong.json()["detail"]


def test_transformer_plan_has_step_estimate_and_fits(api):
    response = api.post(
        "/v1/meshes",
        json={**V5E_TWO_SLICES, "model": TRANSFORMER, "optimizer": "adamw"},
    )
    assert response.status_code == 201, response.text
    plan = response.json()
    step = plan["step_estimate"]
    for key in ("flops", "compute_s", "comm_s", "step_s", "mfu", "bottleneck", "collectives"):
        assert key in step, key
    assert step["step_s"] >= step["compute_s"] / 2 > 0 and 0 < step["mfu"] <= 1
    assert step["collectives"], step
    for entry in step["collectives"]:
        assert {"axis", "kind", "bytes_per_device", "link", "seconds"} <= set(entry)
        assert entry["axis"] in plan["axes"]
    memory = plan["memory_per_device"]
    for key in ("params", "grads", "optimizer", "activations", "batch", "temporaries", "total",
                "hbm_bytes"):  # fmt: skip
        assert isinstance(memory[key], int), key
    assert memory["fits"] is True and memory["hbm_bytes"] == HARDWARE["tpu-v5e"].hbm_bytes
    assert memory["total"] == sum(
        memory[k] for k in ("params", "grads", "optimizer", "activations", "batch", "temporaries")
    )
    assert memory["params"] == sum(p["bytes_per_device"] for p in plan["params"])


def test_too_big_model_does_not_fit(api):
    big = {**TRANSFORMER, "layers": 96, "d_model": 12288, "d_ff": 49152, "heads": 96,
           "kv_heads": 96}  # fmt: skip
    body = {**V5E_TWO_SLICES, "batch_shape": [4096, 2048], "model": big}
    plan = api.post("/v1/meshes", json=body).json()
    assert plan["memory_per_device"]["fits"] is False
    assert plan["memory_per_device"]["total"] > plan["memory_per_device"]["hbm_bytes"]


BAD_PLANS = [
    ("unknown_hardware", {"hardware": "tpu-v9", "topology": "4x4", "ici": {"data": -1}}),
    ("invalid_topology", {"hardware": "tpu-v5e", "topology": "5x7", "ici": {"data": -1}}),
    ("missing_topology", {"hardware": "tpu-v5e", "ici": {"data": -1}}),
    (
        "option_not_applicable",
        {"hardware": "h100-sxm", "hosts": 1, "topology": "4x4", "ici": {"data": -1}},
    ),
    ("invalid_host_count", {"hardware": "gb200-nvl72", "hosts": 3, "ici": {"data": -1}}),
    (
        "unknown_dcn_axis",
        {
            "hardware": "tpu-v5e",
            "topology": "4x4",
            "slices": 2,
            "ici": {"data": -1},
            "dcn": {"pipe": 2},
        },
    ),  # fmt: skip
    (
        "multiple_auto_axes",
        {"hardware": "tpu-v5e", "topology": "4x4", "ici": {"data": -1, "fsdp": -1}},
    ),
    (
        "axes_product_mismatch",
        {"hardware": "tpu-v5e", "topology": "4x4", "ici": {"data": 3}},
    ),
    (
        "physical_axes_split_required",
        {"hardware": "tpu-v5e", "topology": "16x16", "ici": {"data": 64, "tensor": 4}},
    ),
    (
        "batch_not_divisible",
        {"hardware": "tpu-v5e", "topology": "4x4", "ici": {"data": -1}, "batch_shape": [10]},
    ),
    (
        "unknown_axis_role",
        {
            "hardware": "tpu-v5e",
            "topology": "4x4",
            "ici": {"rows": -1},
            "batch_shape": [16, 2048],
            "batch_axes": ["rows"],
            "model": TRANSFORMER,
        },
    ),  # fmt: skip
    (
        "tensor_not_divisible",
        {**V5E_TWO_SLICES, "model": {**TRANSFORMER, "heads": 8, "kv_heads": 8}},
    ),
    (
        "validation_error",
        {"hardware": "tpu-v5e", "topology": "4x4", "ici": {"data": -1}, "num_devices": 16},
    ),
    ("validation_error", {"hardware": "tpu-v5e", "topology": "4x4"}),
    ("validation_error", {"axes": {"data": -1}, "ici": {"data": -1}}),
    ("validation_error", {"axes": {"data": 8}, "num_devices": 8, "model": TRANSFORMER}),
    (
        "validation_error",
        {"hardware": "tpu-v5e", "topology": "4x4", "ici": {"data": -1}, "model": TRANSFORMER},
    ),
]


@pytest.mark.parametrize(
    ("code", "body"), BAD_PLANS, ids=[f"{i}-{case[0]}" for i, case in enumerate(BAD_PLANS)]
)
def test_bad_hardware_plan_is_422_with_code(api, code, body):
    assert_problem(api.post("/v1/meshes", json=body), 422, code)


def test_plain_plan_is_unchanged_by_hardware_fields(api):
    body = {"axes": {"data": -1, "model": 4}, "num_devices": 16, "batch_shape": [32, 8]}
    plan = api.post("/v1/meshes", json=body).json()
    for key in ("axes_detail", "step_estimate", "hardware", "ici"):
        assert key not in plan
    assert set(plan["shards"][0]) == {"device", "process_index", "coords", "index", "replica"}
    assert plan["device_grid"] == np.arange(16).reshape(4, 4).tolist()


# ----------------------------------------------------------- DESIGN v1.2: named models

LLAMA_8B_V6E8 = {
    "hardware": "tpu-v6e",
    "topology": "2x4",
    "ici": {"fsdp": 8},
    "batch_shape": [24, 8192],
    "model": {
        "name": "llama3.1-8b",
        "param_dtype": "float32",
        "remat": "custom",
        "remat_custom": {
            "decoder_layer_input": "offload",
            "query_proj": "offload",
            "key_proj": "offload",
            "value_proj": "offload",
            "out_proj": "offload",
        },
    },
    "optimizer": {"name": "adamw", "learning_rate": 3e-4},
}


def test_a_plan_takes_a_named_model_and_stores_it(api):
    response = api.post("/v1/meshes", json=LLAMA_8B_V6E8)
    assert response.status_code == 201, response.text
    plan = response.json()
    model = plan["model"]
    assert (model["name"], model["d_ff"], model["param_dtype"]) == ("llama3.1-8b", 14336, "float32")
    assert model["remat_custom"]["decoder_layer_input"] == "offload"
    memory = plan["memory_per_device"]
    assert memory["host_offload_bytes"] > 0 and memory["host_memory_bytes"] == 192 * 2**30
    parts = ("params", "optimizer", "grads", "activations", "batch", "temporaries")
    assert sum(memory[p] for p in parts) == memory["total"]
    step = plan["step_estimate"]
    assert step["step_s"] > step["roofline_s"] > 0 and "roofline" in step["gap"]
    assert set(step["breakdown"]) >= {"matmul_s", "attention_s", "offload_s"}
    again = api.get(f"/v1/meshes/{plan['id']}").json()
    assert again["model"] == model


def test_an_unknown_model_name_is_a_problem(api):
    body = {**LLAMA_8B_V6E8, "model": {"name": "llama9"}}
    problem = assert_problem(api.post("/v1/meshes", json=body), 422, "unknown_model")
    assert "llama3.1-8b" in problem["detail"]


def test_a_model_without_kind_or_name_is_refused(api):
    body = {**LLAMA_8B_V6E8, "model": {"layers": 2}}
    assert api.post("/v1/meshes", json=body).status_code == 422


# Kinds of parallelism the plans do not price are refused, never read as another kind
# (issue 37): MaxText's expert axis is not fsdp, its stage axis is not data.
EXPERT_ON_DENSE = {
    "hardware": "tpu-v6e", "topology": "16x16", "ici": {"fsdp": 64, "expert": 4},
    "batch_shape": [256, 4096], "model": {"name": "llama2-7b", "seq_len": 4096},
}  # fmt: skip
STAGES_405B = {
    "hardware": "h100-sxm", "hosts": 64, "ici": {"stage": 1, "fsdp": 8},
    "dcn": {"stage": 8, "fsdp": 8}, "batch_shape": [512, 8192],
    "model": {"name": "llama3.1-405b", "seq_len": 8192},
}  # fmt: skip
ULYSSES = {"hardware": "tpu-v6e", "topology": "4x4", "ici": {"context_usp_ulysses": 4, "fsdp": 4}}


def test_kinds_not_priced_are_refused(api):
    problem = assert_problem(api.post("/v1/meshes", json=ULYSSES), 422, "invalid_parallelism")
    assert "ulysses parallelism" in problem["detail"], problem
    assert "data, fsdp, tensor, expert, stage, context" in problem["detail"], problem


def test_stages_that_do_not_divide_the_layers_are_refused(api):
    # issue 38: the 8 stages of a 405B used to be priced as data parallelism, each stage
    # holding the whole model; its 126 layers do not split into 8 stages
    problem = assert_problem(api.post("/v1/meshes", json=STAGES_405B), 422, "invalid_parallelism")
    assert "126 layers" in problem["detail"] and "7" in problem["detail"], problem


def _plan(api, body: dict) -> dict:
    response = api.post("/v1/meshes", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def test_a_pipelined_plan_holds_its_layers_and_prices_its_bubble(api):
    body = {**STAGES_405B, "batch_shape": [256, 8192],
            "model": {"name": "llama3.1-70b", "remat": "full"}}  # fmt: skip
    flat = _plan(api, {**body, "ici": {"fsdp": 8}, "dcn": {"fsdp": 64}, "batch_shape": [512, 8192]})
    staged = _plan(api, {**body, "pipeline": {"microbatches": 4, "schedule": "1f1b"}})
    pipeline = staged["step_estimate"]["pipeline"]
    assert pipeline == {"stages": 8, "microbatches": 4, "repeats": 1, "layers_per_stage": 10,
                        "schedule": "1f1b", "bubble_fraction": 7 / 11}  # fmt: skip
    assert flat["step_estimate"]["pipeline"] is None
    assert staged["step_estimate"]["breakdown"]["bubble_s"] > 0
    # a stage holds a tenth of the 80 layers: 8 stages x 64 fsdp split them 512 ways, as
    # 512 fsdp would; the embedding is whole on every stage (64 fsdp)
    params = {p["path"]: p["bytes_per_device"] for p in staged["params"]}
    flat_params = {p["path"]: p["bytes_per_device"] for p in flat["params"]}
    assert params["layers/*/mlp/up"] == flat_params["layers/*/mlp/up"]
    assert params["embed/embedding"] == 8 * flat_params["embed/embedding"]
    sends = [c for c in staged["step_estimate"]["collectives"] if c["kind"] == "send-recv"]
    assert {(c["axis"], c["phase"], c["count"]) for c in sends} == {
        ("stage", "forward", 4), ("stage", "backward", 4)}  # fmt: skip


def test_pipeline_or_context_options_without_their_axis_are_refused(api):
    body = {**LLAMA_8B_V6E8, "pipeline": {"microbatches": 4}}
    problem = assert_problem(api.post("/v1/meshes", json=body), 422, "invalid_parallelism")
    assert "no stage axis" in problem["detail"]
    body = {**LLAMA_8B_V6E8, "context_parallel": {"strategy": "ring"}}
    problem = assert_problem(api.post("/v1/meshes", json=body), 422, "invalid_parallelism")
    assert "no context axis" in problem["detail"]


LONG_70B = {
    "hardware": "tpu-v5p", "topology": "4x4x4", "ici": {"fsdp": 16, "context": 4},
    "batch_shape": [16, 131072],
    "model": {"name": "llama3.1-70b", "seq_len": 131072, "remat": "full"},
}  # fmt: skip


def test_a_context_axis_splits_the_sequence_and_gathers_keys_and_values(api):
    plan = _plan(api, LONG_70B)
    estimate = plan["step_estimate"]
    kv = [c for c in estimate["collectives"] if c["what"] == "keys and values"]
    assert {(c["axis"], c["kind"]) for c in kv} >= {("context", "all-gather"),
                                                     ("context", "reduce-scatter")}  # fmt: skip
    ring = _plan(api, {**LONG_70B, "context_parallel": {"strategy": "ring"}})
    assert ring["context_parallel"] == {"strategy": "ring", "load_balance": True}
    kinds = {
        c["kind"] for c in ring["step_estimate"]["collectives"] if c["what"] == "keys and values"
    }
    assert kinds == {"send-recv"}
    # 131072 tokens over 4 context shards
    flat = _plan(api, {**LONG_70B, "ici": {"fsdp": 64}, "batch_shape": [64, 131072]})
    assert plan["memory_per_device"]["total"] < flat["memory_per_device"]["total"] / 2
    bad = {
        **LONG_70B, "batch_shape": [16, 131071],
        "model": {**LONG_70B["model"], "seq_len": 131071},
    }  # fmt: skip
    problem = assert_problem(api.post("/v1/meshes", json=bad), 422, "invalid_parallelism")
    assert "seq_len 131071" in problem["detail"]


def test_shard_over_data_splits_the_optimizer_state_over_the_data_axes(api):
    body = {**LLAMA_8B_V6E8, "ici": {"data": 4, "fsdp": 2}}
    plain = _plan(api, body)
    zero1 = _plan(api, {**body, "optimizer": {"name": "adamw", "shard_over_data": True}})
    assert zero1["shard_over_data"] is True and "shard_over_data" not in plain
    assert zero1["memory_per_device"]["optimizer"] * 4 == plain["memory_per_device"]["optimizer"]
    data_ops = {(c["kind"], c["what"]) for c in zero1["step_estimate"]["collectives"]
                if c["axis"] == "data"}  # fmt: skip
    assert data_ops == {("reduce-scatter", "grads"), ("all-gather", "params")}


def test_an_expert_axis_on_a_dense_model_is_refused_with_what_applies(api):
    # issue 38: expert parallelism is priced now, but a dense model has no experts
    problem = assert_problem(
        api.post("/v1/meshes", json=EXPERT_ON_DENSE), 422, "invalid_parallelism"
    )
    assert "mixture-of-experts" in problem["detail"] and "fsdp" in problem["detail"]


MOE_SMALL = {
    "kind": "transformer", "layers": 4, "d_model": 512, "d_ff": 2048, "heads": 8,
    "kv_heads": 8, "vocab": 32000, "seq_len": 2048, "num_experts": 8,
    "experts_per_token": 2, "moe_d_ff": 1024,
}  # fmt: skip


def test_an_moe_plan_splits_experts_over_the_expert_axis(api):
    body = {
        "hardware": "tpu-v5e", "topology": "4x4", "ici": {"fsdp": 4, "expert": 4},
        "batch_shape": [16, 2048], "model": MOE_SMALL,
    }  # fmt: skip
    response = api.post("/v1/meshes", json=body)
    assert response.status_code == 201, response.text
    plan = response.json()
    estimate = plan["step_estimate"]
    a2a = [c for c in estimate["collectives"] if c["kind"] == "all-to-all"]
    assert {c["axis"] for c in a2a} == {"expert"} and len(a2a) == 2
    assert plan["model"]["num_experts"] == 8
    params = {p["path"]: p for p in plan["params"]}
    wi = params["moe_layers/*/moe/experts/wi_0"]
    assert wi["spec"][0] == "expert", wi


@pytest.mark.parametrize("kind", ["expert", "stage", "context", "diloco"])
def test_size_one_axes_of_kinds_that_do_not_apply_plan(api, kind):
    # an axis of size 1 splits nothing: MaxText's own meshes carry them
    body = {**EXPERT_ON_DENSE, "ici": {"fsdp": 256, kind: 1}}
    assert api.post("/v1/meshes", json=body).status_code == 201


def test_axis_no_kind_claims_lists_the_kinds(api):
    body = {
        "hardware": "tpu-v5e", "topology": "4x4", "ici": {"fsdq": -1},
        "batch_shape": [16, 2048], "model": TRANSFORMER,
    }  # fmt: skip
    problem = assert_problem(api.post("/v1/meshes", json=body), 422, "unknown_axis_role")
    assert "did you mean 'fsdp'" in problem["detail"]
    assert all(kind in problem["detail"] for kind in ("data", "fsdp", "tensor", "expert"))


def test_tpu7x_plan_has_two_devices_per_chip(api):
    # Ironwood: each chip's two TensorCores are two JAX devices (core 0 and 1)
    body = {"hardware": "tpu7x", "topology": "2x2x1", "ici": {"data": 2, "model": 4}}
    response = api.post("/v1/meshes", json=body)
    assert response.status_code == 201, response.text
    plan = response.json()
    assert plan["total_devices"] == 8 == len(plan["shards"])
    shards = plan["shards"]
    assert sorted(s["device"] for s in shards) == list(range(8))
    assert {tuple(s["physical"]) for s in shards} == {(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)}
    for chip in {tuple(s["physical"]) for s in shards}:
        assert sorted(s["core"] for s in shards if tuple(s["physical"]) == chip) == [0, 1]
    assert all(s["device"] % 2 == s["core"] for s in shards)  # libtpu: id = 2 * chip + core
    assert {s["host"] for s in shards} == {0}  # one 4-chip VM
    layout = plan_hardware_devices("tpu7x", topology="2x2x1", ici=body["ici"])
    assert plan["device_grid"] == layout.device_grid.tolist() == [[0, 1, 2, 3], [6, 7, 4, 5]]
    entry = api.get("/v1/hardware/tpu7x").json()
    assert entry["devices_per_chip"] == 2 and entry["device_kind"] == "TPU7x"
