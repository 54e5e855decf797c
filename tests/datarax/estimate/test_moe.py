"""Mixture-of-experts and MLA models in the spec, and the expert axis in the estimates:
parameters counted as MaxText lays them out, expert weights split over the expert axis,
dispatch buffers sized as MaxText sizes them, the all-to-all priced, and an expert axis
that has nothing to split refused."""

from __future__ import annotations

import pytest

from datarax.errors import PlanError
from datarax.estimate.cost import estimate_step
from datarax.estimate.memory import dispatch_factor, memory_estimate
from datarax.estimate.recommend import default_axes
from datarax.hardware.topology import plan_hardware_devices
from datarax.parallel.axis_roles import axis_roles, param_specs
from datarax.specs.model_specs import model_spec

D, F, E, K, L, V = 256, 512, 8, 2, 4, 1000
MOE = {
    "kind": "transformer",
    "layers": L,
    "d_model": D,
    "d_ff": 1024,
    "heads": 8,
    "kv_heads": 4,
    "vocab": V,
    "seq_len": 128,
    "num_experts": E,
    "experts_per_token": K,
    "moe_d_ff": F,
}


def _attention_params(d: int, heads: int, kv: int, hd: int) -> int:
    return d * heads * hd * 2 + 2 * d * kv * hd


def test_moe_layers_count_router_experts_and_shared_experts():
    spec = model_spec({**MOE, "shared_experts": 1, "first_dense_layers": 1})
    hd = D // 8
    attention = _attention_params(D, 8, 4, hd) + 2 * D  # and the two norms
    dense_mlp = 3 * D * 1024
    experts = E * 3 * D * F
    moe_mlp = D * E + experts + 3 * D * F  # router, routed, one shared expert
    head = 2 * V * D + D
    assert spec.moe_layers == L - 1 and spec.dense_layers == 1
    assert spec.param_count() == L * attention + dense_mlp + (L - 1) * moe_mlp + head
    routed_unused = (L - 1) * (E - K) * 3 * D * F
    assert spec.active_param_count() == spec.param_count() - routed_unused
    # each token multiplies through k of the E experts: FLOPs follow the active count
    assert spec.matmul_params() == spec.active_param_count() - V * D - (2 * L + 1) * D
    assert spec.routed_matmul_params() == (L - 1) * K * 3 * D * F
    shapes = spec.param_shapes()
    assert shapes["moe_layers/0/moe/experts/wi_0"] == (E, D, F)
    assert shapes["moe_layers/2/moe/experts/wo"] == (E, F, D)
    assert shapes["dense_layers/0/mlp/gate"] == (D, 1024)
    assert "layers/0/attn/q" not in shapes


def test_moe_every_interleaves_dense_and_moe_layers_as_llama4():
    spec = model_spec({**MOE, "layers": 6, "moe_every": 2})
    # MaxText: (layer + 1) % interleave_moe_layer_step == 0 is an MoE layer
    assert [spec.is_moe_layer(i) for i in range(6)] == [False, True] * 3
    assert spec.ffn_width == (3 * 1024 + 3 * K * F) / 6


def test_a_dense_model_keeps_its_layout_and_counts():
    dense = {
        k: v for k, v in MOE.items() if k not in ("num_experts", "experts_per_token", "moe_d_ff")
    }
    spec = model_spec(dense)
    assert not spec.is_moe and spec.ffn_width == 1024
    assert spec.active_param_count() == spec.param_count()
    assert all(p.startswith(("layers/", "embed", "final", "unembed")) for p in spec.param_shapes())
    assert "num_experts" not in spec.to_json()


def test_mla_counts_deepseek_v3_attention():
    mla = {
        **MOE,
        "heads": 16,
        "kv_heads": 16,
        "attention_type": "mla",
        "q_lora_rank": 96,
        "kv_lora_rank": 64,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
    }
    spec = model_spec(mla)
    h, nope, rope, v = 16, 32, 16, 32
    attention = (
        D * 96 + 96 + 96 * h * (nope + rope)  # queries through the q bottleneck
        + D * (64 + rope) + 64 + 64 * h * (nope + v)  # keys and values through theirs
        + h * v * D
    )  # fmt: skip
    no_mla = model_spec(MOE)
    assert spec.param_count() - no_mla.param_count() == L * (
        attention - _attention_params(D, 8, 4, D // 8)
    )
    assert spec.head_dim == nope + rope == spec.qk_head_dim and spec.value_head_dim == v
    # attention FLOPs: QK^T over qk_head_dim, AV over v_head_dim
    assert spec.attention_flops_per_token() == 6 * L * 128 * h * (48 + 32)
    assert spec.to_json()["attention_type"] == "mla"
    assert model_spec(spec.to_json()) == spec  # the answer's model reads back


@pytest.mark.parametrize(
    ("model", "needle"),
    [
        ({**MOE, "num_experts": 0}, "experts_per_token applies to mixture-of-experts"),
        ({**MOE, "experts_per_token": 9}, "more than num_experts"),
        ({**MOE, "first_dense_layers": L}, "leaves none"),
        ({**MOE, "moe_kernel": "dense"}, "capacity_factor over 0"),
        ({**MOE, "moe_kernel": "tiled"}, "moe_kernel"),
        ({**MOE, "capacity_factor": "2"}, "capacity_factor must be a number"),
        ({**MOE, "attention_type": "mla", "kv_lora_rank": 8}, "kv_heads to heads"),
        ({**MOE, "kv_heads": 8, "attention_type": "mla", "kv_lora_rank": 8}, "needs model."),
        ({**MOE, "q_lora_rank": 8}, "applies to attention_type 'mla'"),
    ],
)
def test_moe_and_mla_fields_are_checked(model, needle):
    with pytest.raises(PlanError, match=needle) as caught:
        model_spec(model)
    assert caught.value.code == "invalid_model"


def test_expert_axis_splits_the_experts_and_the_rest_as_fsdp():
    spec = model_spec(MOE)
    axes = {"fsdp": 2, "expert": 4}
    specs = {
        g.path: (entries, shard)
        for g, entries, shard, _ in param_specs(spec, axes, axis_roles(list(axes)))
    }
    # routed experts: experts over the expert axis, then d over fsdp
    assert specs["moe_layers/*/moe/experts/wi_0"] == (("expert", "fsdp", None), (E // 4, D // 2, F))
    # every other weight is split over fsdp and expert together, as MaxText's rules do
    assert specs["moe_layers/*/attn/q"][0] == (("fsdp", "expert"), None)
    assert specs["moe_layers/*/attn/q"][1] == (D // 8, D)


def test_expert_parallel_memory_splits_expert_state_and_sizes_the_dispatch_buffer():
    spec = model_spec(MOE)
    one = memory_estimate(spec, {"fsdp": 8}, global_batch=8)
    four = memory_estimate(spec, {"fsdp": 2, "expert": 4}, global_batch=8)
    # the same 8 devices split every weight 8 ways either way: state is the same
    assert one["params"] == four["params"] and one["optimizer"] == four["optimizer"]
    # dropless over 4 expert shards: MaxText's worst-case receive buffer, min(4, E/k) = 4
    assert dispatch_factor(spec, 4) == 4 and dispatch_factor(spec, 1) == 1
    assert dispatch_factor(spec, 8) == E / K  # at most E / k times the balanced share
    assert dispatch_factor(model_spec({**MOE, "capacity_factor": 1.25}), 4) == 1.25
    assert four["activations"] > one["activations"]
    tokens = 128  # one sequence per device
    itemsize, mlp = 2, 6
    # one shard: each routed copy and its output (2 rows); over 4 expert shards the
    # kernel's six buffers of the all-to-all's two ways, each 4 times the balanced share
    one_shard = (2 * K * D + mlp * K * F) * itemsize * tokens * L
    four_shards = (6 * K * 4 * D + mlp * K * 4 * F) * itemsize * tokens * L
    assert four["activations"] - one["activations"] == four_shards - one_shard


def test_a_recomputed_capacity_layer_holds_three_hidden_arrays_and_the_cast_experts():
    capacity = {**MOE, "moe_kernel": "dense", "capacity_factor": 1.0, "remat": "full"}
    tokens = 128 * 8  # eight sequences per device: the layer's transient sets the peak

    def estimate(model):
        return memory_estimate(model_spec(model), {"fsdp": 8}, global_batch=64)

    # remat none saves six hidden arrays per expert; the recomputed layer of a remat
    # policy holds three (the product and the two input projections' gradients)
    # (widening moe_d_ff by F also widens the two gathered expert kernels in flight)
    gathered = 2 * E * D * F * 2
    gated, plain = estimate(capacity), estimate({**capacity, "mlp": "plain"})
    wide = estimate({**capacity, "moe_d_ff": 2 * F})
    assert wide["temporaries"] - gated["temporaries"] == 3 * K * F * 2 * tokens + gathered
    wide_plain = estimate({**capacity, "mlp": "plain", "moe_d_ff": 2 * F})
    assert wide_plain["temporaries"] - plain["temporaries"] == 2 * K * F * 2 * tokens + gathered
    # the dropless kernel keeps autodiff's six under recompute as well
    sparse = {**capacity, "moe_kernel": "sparse", "capacity_factor": 0.0}
    assert (estimate({**sparse, "moe_d_ff": 2 * F})["temporaries"]
            - estimate(sparse)["temporaries"]) >= 6 * K * F * 2 * tokens  # fmt: skip
    # float32 expert kernels are cast to bfloat16 once, each device's shard of all layers
    f32 = estimate({**capacity, "param_dtype": "float32"})
    experts = 3 * E * D * F * L // 8
    assert f32["temporaries"] - gated["temporaries"] == experts * 2


def _links(hw: str, topology: str, ici: dict[str, int]):
    return plan_hardware_devices(hw, topology=topology, ici=ici).axes_detail


def test_expert_all_to_all_is_priced_on_its_link_and_flops_count_active_experts():
    spec = model_spec(MOE)
    links = _links("tpu-v5e", "4x4", {"fsdp": 4, "expert": 4})
    est = estimate_step("tpu-v5e", links, spec, global_batch=16)
    a2a = [c for c in est["collectives"] if c["kind"] == "all-to-all"]
    assert {(c["axis"], c["phase"], c["what"]) for c in a2a} == {
        ("expert", "forward", "tokens"),
        ("expert", "backward", "tokens"),
    }
    tokens = 128  # 16 sequences over 16 batch shards
    for c in a2a:
        assert c["count"] == 2 * L  # dispatch and combine, every MoE layer
        assert c["bytes_per_device"] == 2 * L * tokens * K * D * 2
    # model FLOPs: 6 x the active matmul parameters per token, plus causal attention
    expected = (6 * spec.matmul_params() + spec.attention_flops_per_token() / 2) * 16 * 128
    assert est["flops"] == pytest.approx(expected)
    assert spec.matmul_params() < model_spec({**MOE, "experts_per_token": E}).matmul_params()


def test_more_experts_per_token_take_longer():
    links = _links("tpu-v5e", "4x4", {"fsdp": 4, "expert": 4})
    k2 = estimate_step("tpu-v5e", links, MOE, global_batch=16)
    k4 = estimate_step("tpu-v5e", links, {**MOE, "experts_per_token": 4}, global_batch=16)
    assert k4["step_s"] > k2["step_s"] and k4["flops"] > k2["flops"]


@pytest.mark.parametrize(
    ("model", "axes", "needle"),
    [
        ({**MOE, "num_experts": 0, "experts_per_token": None, "moe_d_ff": None},
         {"fsdp": 4, "expert": 2}, "name the axis fsdp"),
        ({**MOE, "num_experts": 6}, {"fsdp": 2, "expert": 4}, "do not divide"),
    ],
)  # fmt: skip
def test_an_expert_axis_with_nothing_to_split_is_refused(model, axes, needle):
    model = {k: v for k, v in model.items() if v is not None}
    with pytest.raises(PlanError, match=needle) as caught:
        memory_estimate(model, axes, global_batch=8)
    assert caught.value.code == "invalid_parallelism"


def test_recommendations_search_the_expert_axis_for_moe_models_only():
    assert default_axes(model_spec(MOE)) == ("data", "fsdp", "tensor", "expert")
    dense = {
        k: v for k, v in MOE.items() if k not in ("num_experts", "experts_per_token", "moe_d_ff")
    }
    assert default_axes(model_spec(dense)) == ("data", "fsdp", "tensor")


def test_the_expert_axis_takes_a_share_of_the_batch():
    links = _links("tpu-v5e", "4x8", {"data": 4, "expert": 8})
    assert estimate_step("tpu-v5e", links, MOE, 32)["tokens_per_device"] == 128
    with pytest.raises(PlanError) as caught:
        estimate_step("tpu-v5e", links, MOE, 16)  # 16 sequences over 32 batch shards
    assert caught.value.code == "batch_not_divisible"
