"""Every input of a hardware plan is used or refused (issue 56, item 1; DESIGN v1.4):
``batch_shape`` is ``[global sequences, sequence length]`` and ``seq_len`` agrees with it or
is refused; parameters an axis leaves whole are warnings with their bytes; plans and
``/v1/models`` carry ``total_params`` and ``active_params``; the step estimate carries
``tokens_per_s`` and ``tflops_per_device``, its ``flops`` and ``mfu`` counted as MaxText
counts them. (The walk over every field of every plan body is ``test_plan_fields.py``.)"""

from __future__ import annotations

import math
import re

import pytest

from datarax.specs.named_models import MODELS
from tests.helpers import assert_problem

# the README's first question: Llama 3.1 8B on a v6e-8, FSDP, full remat
LLAMA_8B = {
    "hardware": "tpu-v6e", "topology": "2x4", "ici": {"fsdp": 8},
    "model": {"name": "llama3.1-8b", "remat": "full"},
}  # fmt: skip


def _plan(api, body: dict) -> dict:
    response = api.post("/v1/meshes", json=body)
    assert response.status_code == 201, response.text
    return response.json()


# ------------------------------------------------------------ batch_shape and seq_len


def test_the_sequence_length_is_batch_shape_1_not_the_named_models_context(api):
    long = _plan(api, {**LLAMA_8B, "batch_shape": [16, 8192]})
    short = _plan(api, {**LLAMA_8B, "batch_shape": [16, 2048]})
    # before issue 56 both priced the model card's 8192 tokens: the same 1.812 s
    assert short["step_estimate"]["step_s"] < long["step_estimate"]["step_s"] / 2
    assert short["memory_per_device"]["activations"] < long["memory_per_device"]["activations"]
    assert (long["model"]["seq_len"], short["model"]["seq_len"]) == (8192, 2048)
    assert short["step_estimate"]["tokens_per_device"] == 16 * 2048 // 8
    # seq_len sent equal to batch_shape[1] is the same plan as leaving it out
    same = _plan(api, {**LLAMA_8B, "batch_shape": [16, 2048],
                       "model": {**LLAMA_8B["model"], "seq_len": 2048}})  # fmt: skip
    assert same["step_estimate"] == short["step_estimate"]
    assert same["memory_per_device"] == short["memory_per_device"]


@pytest.mark.parametrize(
    ("batch_shape", "model", "words"),
    [
        ([16, 2048], {"name": "llama3.1-8b", "seq_len": 8192}, ("seq_len 8192", "[1] 2048")),
        ([16, 2048, 4], {"name": "llama3.1-8b"}, ("[global sequences, sequence length]",)),
        ([16], {"name": "llama3.1-8b"}, ("[global sequences, sequence length]",)),
        ([16, 0], {"name": "llama3.1-8b"}, ("at least 1",)),
    ],
    ids=["seq-len-differs", "three-dims", "one-dim", "no-tokens"],
)
def test_a_batch_shape_that_is_not_sequences_by_seq_len_is_refused(api, batch_shape, model, words):
    body = {**LLAMA_8B, "batch_shape": batch_shape, "model": model}
    problem = assert_problem(api.post("/v1/meshes", json=body), 422, "invalid_batch_shape")
    for word in words:
        assert word in problem["detail"], problem["detail"]


def test_recommendations_price_global_batch_sequences_of_the_models_seq_len(api):
    body = {
        "hardware": "tpu-v5p", "topology": "2x2x2",
        "model": {"name": "llama3.1-8b", "remat": "full"},
        "global_batch": 16, "top_k": 1, "axes": ["fsdp"],
    }  # fmt: skip
    response = api.post("/v1/recommendations", json=body)
    assert response.status_code == 200, response.text
    candidate = response.json()["candidates"][0]
    # the named model's context length is the default here: there is no batch_shape
    assert candidate["plan_request"]["batch_shape"] == [16, MODELS["llama3.1-8b"].seq_len]
    plan = _plan(api, candidate["plan_request"])
    assert plan["step_estimate"]["step_s"] == candidate["step_estimate"]["step_s"]
    shorter = {**body, "model": {**body["model"], "seq_len": 2048}}
    short = api.post("/v1/recommendations", json=shorter).json()["candidates"][0]
    assert short["plan_request"]["batch_shape"] == [16, 2048]
    assert short["step_estimate"]["step_s"] < candidate["step_estimate"]["step_s"]


# ------------------------------------------------------------ parameters left whole


DEEPSEEK_FSDP_384 = {
    "hardware": "tpu-v5p", "topology": "4x4x8", "slices": 3,
    "ici": {"fsdp": -1}, "dcn": {"fsdp": 3}, "batch_shape": [384, 4096],
    "model": {"name": "deepseek3-671b"},
}  # fmt: skip

_WHOLE = re.compile(
    r"parameter (\S+) \[[\d, ]+\] stays whole on (\S+): (\d+) divides (.+?), so each "
    r"device holds ([\d.]+ \w+) of it, ([\d.]+ \w+) more than if"
)


def _whole(plan: dict) -> dict[str, tuple[str, ...]]:
    found = {}
    for warning in plan["warnings"]:
        match = _WHOLE.match(warning)
        if match:
            found[match[1]] = match.groups()[1:]
    return found


def test_a_parameter_fsdp_does_not_divide_is_a_warning_with_its_bytes(api):
    plan = _plan(api, DEEPSEEK_FSDP_384)
    assert plan["axes"] == {"fsdp": 384}
    whole = _whole(plan)
    # 256 experts x 7168 x 2048: 384 (3 x 128) divides none of them
    axis, size, what, held, extra = whole["moe_layers/*/moe/experts/wi_0"]
    assert (axis, size, what) == ("fsdp", "384", "none of its dimensions")
    params = {p["path"]: p for p in plan["params"]}
    experts = params["moe_layers/*/moe/experts/wi_0"]
    assert experts["spec"] == [None, None, None]
    assert held == f"{experts['bytes_per_device'] / 2**30:.3g} GiB"
    assert extra == f"{(experts['bytes_per_device'] * 383 // 384) / 2**30:.3g} GiB"
    # the biggest cost first; a parameter fsdp splits has no warning
    assert next(iter(whole)).startswith("moe_layers/*/moe/experts/")
    assert params["dense_layers/*/mlp/gate"]["spec"] != [None, None]
    assert "dense_layers/*/mlp/gate" not in whole
    # on 256 devices every expert kernel splits: no such warning
    even = _plan(api, {**DEEPSEEK_FSDP_384, "topology": "4x8x8", "slices": 1, "dcn": None,
                       "batch_shape": [256, 4096]})  # fmt: skip
    assert not [w for w in _whole(even) if "experts" in w]


def test_a_tensor_axis_that_does_not_divide_the_vocabulary_is_a_warning(api):
    model = {"kind": "transformer", "layers": 2, "d_model": 256, "d_ff": 1024, "heads": 4,
             "kv_heads": 4, "vocab": 1001, "seq_len": 128}  # fmt: skip
    body = {"hardware": "tpu-v5e", "topology": "2x2", "ici": {"tensor": 4},
            "batch_shape": [4, 128], "model": model}  # fmt: skip
    whole = _whole(_plan(api, body))
    assert whole["embed/embedding"][:3] == ("tensor", "4", "not its dimension 0 (1001)")
    assert whole["unembed/kernel"][:3] == ("tensor", "4", "not its dimension 1 (1001)")
    assert not _whole(_plan(api, {**body, "model": {**model, "vocab": 1000}}))


# ------------------------------------------------------------ parameter counts


def test_models_and_plans_carry_total_and_active_params(api):
    items = {m["name"]: m for m in api.get("/v1/models").json()["items"]}
    assert set(items) == set(MODELS)
    for name, item in items.items():
        assert 0 < item["active_params"] <= item["total_params"], name
        dense = "num_experts" not in item
        assert (item["active_params"] == item["total_params"]) is dense, name
    # the model cards' figures (each source names its card)
    assert items["mixtral-8x7b"]["total_params"] / 1e9 == pytest.approx(46.7, rel=0.01)
    assert items["mixtral-8x7b"]["active_params"] / 1e9 == pytest.approx(12.9, rel=0.01)
    assert items["deepseek3-671b"]["active_params"] / 1e9 == pytest.approx(37, rel=0.02)
    assert api.get("/v1/models/llama3.1-8b").json()["total_params"] == 8_030_261_248
    # a plan carries the counts of the model it resolved (overrides included)
    plan = _plan(api, {**LLAMA_8B, "batch_shape": [16, 2048]})
    entry = items["llama3.1-8b"]
    assert (plan["total_params"], plan["active_params"]) == (
        entry["total_params"], entry["active_params"])  # fmt: skip
    moe = _plan(api, {**LLAMA_8B, "batch_shape": [16, 2048],
                      "model": {"name": "mixtral-8x7b", "layers": 4}})  # fmt: skip
    per_layer = (items["mixtral-8x7b"]["total_params"] - plan_head(items["mixtral-8x7b"])) / 32
    assert moe["total_params"] == pytest.approx(plan_head(items["mixtral-8x7b"]) + 4 * per_layer)
    assert moe["active_params"] < moe["total_params"]
    mlp = _plan(
        api,
        {
            "hardware": "cpu",
            "hosts": 1,
            "ici": {"data": -1},
            "batch_shape": [8, 4],
            "model": {"kind": "mlp", "features": [4, 8, 2]},
        },
    )
    assert mlp["total_params"] == mlp["active_params"] == 4 * 8 + 8 + 8 * 2 + 2


def plan_head(entry: dict) -> int:
    """The parameters outside the layers: embedding, unembedding, final norm."""
    d, v = entry["d_model"], entry["vocab"]
    return v * d * (1 if entry["tied_embeddings"] else 2) + d


# ------------------------------------------------------------ FLOPs as MaxText counts them


def _maxtext_flops_per_device(m: dict, sequences_per_device: float) -> float:
    """MaxText's calculate_tflops_training_per_device (src/maxtext/utils/maxtext_utils.py
    at e591f30) for the decoder blocks the named models use, written out here from its
    terms: the FFN's matmuls (routed experts k times, the gate, shared experts), q/k/v and
    the out projection (MLA's down and up projections), the unembedding, each x3 (forward
    and backward); attention 4 B S^2 H hd (MLA: 2 B S^2 H (qk + v)) halved for the
    causal mask, x3."""
    bs = sequences_per_device * m["seq_len"]
    s, d, h = m["seq_len"], m["d_model"], m["heads"]
    mats = 3 if m["mlp"] == "gated" else 2

    def ffn(width: int) -> float:
        return 2 * bs * width * d * mats

    experts = m.get("num_experts", 0)
    if experts > 1:
        moe = 2 * bs * d * experts + ffn(m["moe_d_ff"]) * (
            m["experts_per_token"] + m.get("shared_experts", 0)
        )
        dense_layers = m.get("first_dense_layers", 0)
        ffn_all = ffn(m["d_ff"]) * dense_layers + moe * (m["layers"] - dense_layers)
    else:
        ffn_all = ffn(m["d_ff"]) * m["layers"]
    if m.get("attention_type") == "mla":
        qk = m["qk_nope_head_dim"] + m["qk_rope_head_dim"]
        q = 2 * bs * (d * m["q_lora_rank"] + m["q_lora_rank"] * h * qk)
        kv = (
            2
            * bs
            * (
                d * (m["kv_lora_rank"] + m["qk_rope_head_dim"])
                + m["kv_lora_rank"] * h * (m["qk_nope_head_dim"] + m["v_head_dim"])
            )
        )
        qkv, attention = q + kv, 2 * bs * s * h * (qk + m["v_head_dim"]) / 2
        projection = 2 * bs * d * h * m["v_head_dim"]
    else:
        hd = m["head_dim"]
        qkv = 2 * bs * d * (h + 2 * m["kv_heads"]) * hd
        attention = 4 * bs * s * h * hd / 2
        projection = 2 * bs * d * h * hd
    embedding = 2 * bs * d * m["vocab"]
    weights = (ffn_all + (qkv + projection) * m["layers"] + embedding) * 3
    return weights + attention * m["layers"] * 3


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("llama3.1-8b", {**LLAMA_8B, "batch_shape": [16, 8192]}),
        ("llama3.1-70b", {"hardware": "tpu-v5p", "topology": "4x4x4",
                          "ici": {"fsdp": 16, "context": 4}, "batch_shape": [16, 131072],
                          "model": {"name": "llama3.1-70b", "remat": "full"}}),
        ("deepseek3-671b", {**DEEPSEEK_FSDP_384, "topology": "4x8x8", "slices": 1,
                            "dcn": None, "batch_shape": [256, 4096]}),
    ],
    ids=["dense-8k", "dense-128k-context", "mla-moe"],
)  # fmt: skip
def test_flops_tokens_and_tflops_are_counted_as_maxtext_counts_them(api, name, body):
    plan = _plan(api, body)
    step = plan["step_estimate"]
    devices = math.prod(plan["axes"].values())
    sequences, seq_len = body["batch_shape"]
    model = {**MODELS[name].to_json(), "seq_len": seq_len}
    per_device = _maxtext_flops_per_device(model, sequences / devices)
    assert step["flops"] / devices == pytest.approx(per_device, rel=1e-9)
    assert step["tokens_per_s"] == pytest.approx(sequences * seq_len / step["step_s"])
    assert step["tflops_per_device"] == pytest.approx(per_device / step["step_s"] / 1e12)
    assert step["mfu"] == pytest.approx(step["tflops_per_device"] * 1e12 / step["peak_flops"])


def test_long_context_mfu_counts_causal_attention_half(api):
    plan = _plan(api, {"hardware": "tpu-v5p", "topology": "4x4x4",
                       "ici": {"fsdp": 16, "context": 4}, "batch_shape": [16, 131072],
                       "model": {"name": "llama3.1-70b", "remat": "full"}})  # fmt: skip
    step = plan["step_estimate"]
    m = {**MODELS["llama3.1-70b"].to_json(), "seq_len": 131072}
    tokens = 16 * 131072
    matmul = _maxtext_flops_per_device(m, 16 / 64) * 64 - 3 * 2 * tokens * 131072 * 64 * 128 * 80
    # the non-causal count (what the plan said before issue 56) is well above MaxText's
    non_causal = matmul + 12 * 80 * 131072 * 64 * 128 * tokens
    assert step["flops"] < 0.75 * non_causal
    assert step["mfu"] == pytest.approx(step["flops"] / (64 * step["peak_flops"] * step["step_s"]))


# ------------------------------------------------------------ inputs that said nothing


@pytest.mark.parametrize(
    ("member", "value", "default"),
    [("platform", "tpu", None), ("param_sharding", "fsdp", "replicate"),
     ("allow_split_physical_axes", True, False)],
)  # fmt: skip
def test_members_maxtext_keys_say_are_refused_beside_maxtext(api, member, value, default):
    body = {"hardware": "tpu-v5e", "topology": "2x2",
            "maxtext": {"ici_fsdp_parallelism": -1, "model_name": "llama2-7b",
                        "per_device_batch_size": 1, "max_target_length": 128}}  # fmt: skip
    problem = assert_problem(
        api.post("/v1/meshes", json={**body, member: value}), 422, "validation_error"
    )
    assert f"{member} " in problem["detail"] and "change nothing" in problem["detail"]
    # at its default it means the same as leaving it out
    assert api.post("/v1/meshes", json={**body, member: default}).status_code == 201


def test_an_mla_head_dim_that_nothing_reads_is_refused(api):
    body = {
        **DEEPSEEK_FSDP_384,
        "topology": "4x8x8",
        "slices": 1,
        "dcn": None,
        "batch_shape": [256, 4096],
        "model": {"name": "deepseek3-671b", "head_dim": 128},
    }
    problem = assert_problem(api.post("/v1/meshes", json=body), 422, "invalid_model")
    assert "qk_nope_head_dim + qk_rope_head_dim = 192" in problem["detail"]
    body["model"]["head_dim"] = 192
    assert api.post("/v1/meshes", json=body).status_code == 201


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"axes": {"data": -1}, "num_devices": 4, "optimizer": "sgd"}, "optimizer"),
        ({"axes": {"data": -1}, "num_devices": 4, "param_sharding": "fsdp"}, "param_sharding"),
        ({"hardware": "tpu-v5e", "topology": "2x2", "ici": {"fsdp": -1},
          "calibration": "published-tpu-jax"}, "calibration"),
        ({"hardware": "tpu-v5e", "topology": "2x2", "ici": {"fsdp": -1},
          "optimizer": {"name": "adam", "shard_over_data": True}}, "optimizer"),
        ({"axes": {"data": -1}, "num_devices": 4, "batch_shape": [8, 4],
          "model": {"kind": "mlp", "features": [4, 2], "optimizer": "sgd"},
          "optimizer": "adamw"}, "given twice"),
        ({"axes": {"data": -1}, "num_devices": 4, "batch_shape": [8, 4],
          "model": {"kind": "mlp", "features": [4, 2]},
          "optimizer": {"name": "adam", "shard_over_data": True}}, "shard_over_data"),
        ({"axes": {"data": -1}, "platform": "tpu"}, "platform"),
    ],
    ids=["optimizer-no-model", "param-sharding-no-model", "calibration-no-model",
         "zero1-no-model", "optimizer-twice", "zero1-plain", "live-platform"],
)  # fmt: skip
def test_inputs_that_nothing_would_read_are_refused(api, body, words):
    problem = assert_problem(api.post("/v1/meshes", json=body), 422, "validation_error")
    assert words in problem["detail"], problem["detail"]


def test_maxtext_keys_the_plan_does_not_read_are_warnings_and_zero1_is_kept(api):
    keys = {"ici_fsdp_parallelism": -1, "model_name": "llama2-7b", "per_device_batch_size": 1,
            "max_target_length": 128, "learning_rate": 3e-4, "steps": 10}  # fmt: skip
    body = {"hardware": "tpu-v5e", "topology": "2x2", "maxtext": keys}
    plan = _plan(api, body)
    assert any("learning_rate" in w and "steps" in w for w in plan["warnings"]), plan["warnings"]
    zero1 = {**keys, "ici_data_parallelism": 2, "ici_fsdp_parallelism": 2,
             "shard_optimizer_over_data": True}  # fmt: skip
    # the body's optimizer names it; MaxText's shard_optimizer_over_data still counts
    kept = _plan(api, {**body, "maxtext": zero1, "optimizer": "adamw"})
    assert kept["shard_over_data"] is True
    plain = _plan(api, {**body, "maxtext": {**zero1, "shard_optimizer_over_data": False},
                        "optimizer": "adamw"})  # fmt: skip
    assert kept["memory_per_device"]["optimizer"] < plain["memory_per_device"]["optimizer"]
