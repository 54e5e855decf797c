"""Named models, MaxText's model fields and remat policies, and what the estimate makes of
them: mixed precision, host offload, the compute dtype's peak."""

from __future__ import annotations

import dataclasses
import re

import pytest

from datarax.estimate.cost import estimate_step
from datarax.estimate.memory import hardware_memory, memory_estimate
from datarax.hardware.chips import HARDWARE, get_hardware
from datarax.hardware.topology import plan_hardware_devices
from datarax.specs.model_specs import (
    TransformerSpec,
    model_spec,
)
from datarax.specs.named_models import MODELS, models_json

# Parameter counts the model cards and papers publish (billions).
PUBLISHED = {
    "llama2-7b": 6.74,
    "llama2-13b": 13.0,
    "llama2-70b": 69.0,
    "llama3.1-8b": 8.03,
    "llama3.1-70b": 70.6,
    "llama3.1-405b": 405.9,
    "mistral-7b": 7.24,
    "gemma2-9b": 9.24,
    "gemma2-27b": 27.2,
    "gpt3-175b": 175.0,
}

# Mixture-of-experts models: (name, card's total, card's active (billions), the card or
# paper that publishes both).
MOE_CARDS = [
    ("mixtral-8x7b", 46.7, 12.9, "https://mistral.ai/news/mixtral-of-experts"),
    ("mixtral-8x22b", 141.0, 39.0, "https://mistral.ai/news/mixtral-8x22b"),
    ("deepseek3-671b", 671.0, 37.0, "https://arxiv.org/abs/2412.19437"),
    ("qwen3-30b-a3b", 30.5, 3.3, "https://huggingface.co/Qwen/Qwen3-30B-A3B"),
    ("qwen3-235b-a22b", 235.0, 22.0, "https://huggingface.co/Qwen/Qwen3-235B-A22B"),
    ("llama4-17b-16e", 109.0, 17.0, "https://huggingface.co/meta-llama/Llama-4-Scout-17B-16E"),
    ("llama4-17b-128e", 400.0, 17.0,
     "https://huggingface.co/meta-llama/Llama-4-Maverick-17B-128E"),
    ("gpt-oss-120b", 116.83, 5.13, "https://arxiv.org/abs/2508.10925"),
]  # fmt: skip
MOE_NAMES = [row[0] for row in MOE_CARDS]
# gpt-oss's card counts active parameters without the embedding table (its unembedding
# in): 5.13B; the spec's active count has the embedding, as the other cards do.
ACTIVE_WITHOUT_EMBEDDING = {"gpt-oss-120b"}
MAXTEXT_MOE_CONFIG = re.compile(
    r"https://github\.com/AI-Hypercomputer/maxtext/blob/[0-9a-f]{40}/src/maxtext/configs/"
    r"models/(?P<name>[\w.-]+)\.yml"
)

OFFLOADED_8B = {
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
}


@pytest.mark.parametrize("name", sorted(PUBLISHED), ids=sorted(PUBLISHED))
def test_named_models_have_their_published_size_and_a_source(name):
    spec = model_spec({"name": name})
    assert isinstance(spec, TransformerSpec) and spec.name == name
    assert spec.param_count() / 1e9 == pytest.approx(PUBLISHED[name], rel=0.01)
    assert "maxtext" in MODELS[name]["source"].lower()


@pytest.mark.parametrize(("name", "total", "active"), [row[:3] for row in MOE_CARDS], ids=MOE_NAMES)
def test_moe_models_have_their_cards_total_and_active_size(name, total, active):
    spec = model_spec({"name": name})
    assert isinstance(spec, TransformerSpec) and spec.name == name
    assert spec.param_count() / 1e9 == pytest.approx(total, rel=0.02)
    counted = spec.active_param_count()
    if name in ACTIVE_WITHOUT_EMBEDDING:
        counted -= spec.vocab * spec.d_model
    assert counted / 1e9 == pytest.approx(active, rel=0.02)
    assert spec.active_param_count() < spec.param_count()


@pytest.mark.parametrize(("name", "total", "active", "card"), MOE_CARDS, ids=MOE_NAMES)
def test_moe_entries_name_maxtexts_commit_their_card_and_what_is_not_priced(
    name, total, active, card
):
    entry = MODELS[name]
    found = MAXTEXT_MOE_CONFIG.search(entry["source"])
    assert found and found["name"] == name
    assert card in entry["source"]
    assert f"{total:g}B" in entry["source"] and f"{active:g}B" in entry["source"]
    assert entry["notes"]


def test_moe_entries_keep_maxtexts_layer_pattern():
    deepseek = MODELS["deepseek3-671b"]
    assert deepseek["first_dense_layers"] == 3 and deepseek["shared_experts"] == 1
    assert deepseek["attention_type"] == "mla" and deepseek["kv_heads"] == deepseek["heads"]
    assert deepseek["head_dim"] == deepseek["qk_nope_head_dim"] + deepseek["qk_rope_head_dim"]
    # Maverick alternates dense (16384 wide) and MoE layers; Scout is MoE throughout
    assert MODELS["llama4-17b-128e"]["moe_every"] == 2
    assert MODELS["llama4-17b-128e"]["d_ff"] == 2 * MODELS["llama4-17b-128e"]["moe_d_ff"]
    assert MODELS["llama4-17b-16e"]["moe_every"] == 1
    # capacity and kernel are left to the request (MaxText's defaults: dropless, sparse)
    assert not any({"capacity_factor", "moe_kernel"} & set(MODELS[n]) for n in MOE_NAMES)


def test_the_catalog_lists_what_the_issue_asks_for():
    assert set(PUBLISHED) <= set(MODELS)
    assert set(MOE_NAMES) <= set(MODELS)
    items = models_json()
    assert [item["name"] for item in items] == list(MODELS)
    assert all(item["source"] for item in items)


def test_policies_order_memory_as_maxtext_says():
    # base.yml orders them fastest (most HBM) to slowest: the kept bytes must not grow
    axes = {"fsdp": 8}
    order = ["minimal", "save_dot_except_mlpwi", "save_dot_except_mlp", "save_qkv_proj",
             "save_out_proj", "full"]  # fmt: skip
    kept = [
        memory_estimate({"name": "llama3.1-8b", "remat": r}, axes, 8)["activations"] for r in order
    ]
    assert kept == sorted(kept, reverse=True)
    assert kept[0] > kept[-1]


def test_param_dtype_holds_parameters_grads_and_moments():
    axes = {"fsdp": 8}
    bf16 = memory_estimate({"name": "llama3.1-8b", "remat": "full"}, axes, 8)
    fp32 = memory_estimate({"name": "llama3.1-8b", "remat": "full", "param_dtype": "float32"},
                           axes, 8)  # fmt: skip
    for part in ("params", "grads", "optimizer"):
        assert fp32[part] == 2 * bf16[part]
    assert fp32["activations"] == bf16["activations"]  # compute stays bfloat16
    assert fp32["optimizer"] == 2 * fp32["params"]  # two Adam moments in float32


def test_offloaded_activations_leave_hbm_for_host_memory():
    v6e = hardware_memory(get_hardware("tpu-v6e"))
    axes = {"fsdp": 8}
    offloaded = memory_estimate(OFFLOADED_8B, axes, 24, **v6e)
    on_device = {**OFFLOADED_8B, "remat_custom": dict.fromkeys(OFFLOADED_8B["remat_custom"],
                                                               "device")}  # fmt: skip
    kept = memory_estimate(on_device, axes, 24, **v6e)
    moved = kept["activations"] - offloaded["activations"]
    assert moved > 0 and offloaded["host_offload_bytes"] == moved
    assert kept["host_offload_bytes"] == 0
    assert offloaded["total"] == kept["total"] - moved
    # per token and layer: the layer input, q, k, v and the out projection, bf16
    spec = model_spec(OFFLOADED_8B)
    per_token = 2 * (4096 + 4096 + 1024 + 1024 + 4096)
    assert offloaded["host_offload_bytes"] == 24 // 8 * 8192 * spec.layers * per_token
    # the host's DRAM is the limit: v6e has 1536 GiB per 8 chips
    assert offloaded["host_memory_bytes"] == 192 * 2**30
    tight = memory_estimate(OFFLOADED_8B, axes, 24, **{**v6e, "host_memory_bytes": 2**30})
    assert tight["fits"] is False and tight["total"] == offloaded["total"]


def test_offload_transfers_are_priced_on_the_host_link():
    layout = plan_hardware_devices("tpu-v6e", topology="2x4", ici={"fsdp": 8})
    est = estimate_step("tpu-v6e", layout.axes_detail, OFFLOADED_8B, 24)
    hw = HARDWARE["tpu-v6e"]
    host = est.memory_per_device.host_offload_bytes
    assert est.predicted_components["offload"] == pytest.approx(host / hw.host_link_bytes_per_s)
    narrow = dataclasses.replace(hw, host_link_bytes_per_s=hw.host_link_bytes_per_s / 100)
    slow = estimate_step(narrow, layout.axes_detail, OFFLOADED_8B, 24)
    assert slow["breakdown"]["offload_s"] > 0
    assert slow["step_s"] > est["step_s"]


def test_float32_compute_is_priced_at_the_float32_peak():
    layout = plan_hardware_devices("h100-sxm", hosts=1, ici={"fsdp": 8})
    model = {"name": "llama2-7b", "seq_len": 2048, "remat": "full"}
    bf16 = estimate_step("h100-sxm", layout.axes_detail, model, 8)
    fp32 = estimate_step("h100-sxm", layout.axes_detail, {**model, "dtype": "float32"}, 8)
    assert bf16["peak_flops"] == HARDWARE["h100-sxm"].peak_bf16_flops
    assert fp32["peak_flops"] == HARDWARE["h100-sxm"].peak_fp32_flops == 6.7e13
    assert fp32["breakdown"]["matmul_s"] == pytest.approx(
        bf16["breakdown"]["matmul_s"] * 9.895e14 / 6.7e13
    )
    assert fp32["mfu"] == pytest.approx(fp32["flops"] / (8 * 6.7e13 * fp32["step_s"]))


def test_the_prediction_is_the_roofline_plus_what_real_steps_spend():
    layout = plan_hardware_devices("tpu-v6e", topology="2x4", ici={"fsdp": 8})
    est = estimate_step("tpu-v6e", layout.axes_detail, OFFLOADED_8B, 24)
    parts = est["breakdown"]
    assert est["step_s"] > est["roofline_s"] > 0
    assert est["step_s"] == pytest.approx(
        parts["matmul_s"] + parts["attention_s"] + parts["memory_bound_s"]
        + parts["exposed_comm_s"] + parts["offload_s"] + parts["overhead_s"]
    )  # fmt: skip
    assert est["mfu"] < est["roofline_mfu"] <= 1.0
    assert "x the roofline" in est["gap"]


def test_flash_attention_keeps_no_scores_and_skips_the_causal_half():
    axes = {"fsdp": 8}
    model = {"name": "llama3.1-8b", "remat": "none"}
    dot = memory_estimate({**model, "attention": "dot"}, axes, 8)
    flash = memory_estimate(model, axes, 8)
    spec = model_spec(model)
    tokens = 8192
    h, hd = spec.heads, spec.head_dim
    # dot keeps softmax's float32 output, the bf16 probabilities and two float32
    # statistics per head; flash its output's second view and one float32 log-sum-exp
    per_token = (4 + 2) * h * spec.seq_len + 2 * 4 * h - (2 * h * hd + 4 * h)
    assert dot["activations"] - flash["activations"] == spec.layers * per_token * tokens


def test_vocab_tiling_keeps_one_tile_of_logits():
    axes = {"fsdp": 8}
    one = memory_estimate({"name": "llama3.1-8b", "remat": "full"}, axes, 8)
    eight = memory_estimate({"name": "llama3.1-8b", "remat": "full", "vocab_tiling": 8}, axes, 8)
    # the loss keeps no logits either way (its backward pass recomputes them); the tiles
    # bound the logits and their gradient live at once
    assert one["activations"] == eight["activations"]
    assert eight["temporaries"] < one["temporaries"] and eight["total"] < one["total"]


def test_tied_embeddings_drop_the_unembedding():
    tied = model_spec({"name": "gemma2-9b"})
    untied = model_spec({"name": "gemma2-9b", "tied_embeddings": False})
    assert "unembed/kernel" not in {g.path for g in tied.params()}
    assert untied.param_count() - tied.param_count() == 256128 * 3584
    assert tied.matmul_params() == untied.matmul_params()  # the logits still multiply
