"""Serving estimates (issue 57): KV cache and weights per device checked against figures
computed by hand from the model cards, capacity and batch, latency sanity, MoE decode, and
the SLO recommendation's ranking and rejection reasons."""

from __future__ import annotations

from dataclasses import replace

import pytest

from datarax.answers.calibrations import CalibrationConstants
from datarax.errors import PlanError
from datarax.estimate.serving import estimate_serving, reached_experts
from datarax.estimate.serving_memory import (
    ServingLayout,
    ServingOptions,
    kv_bytes_per_token,
    serving_capacity,
    serving_layout,
    weights_bytes_per_device,
)
from datarax.estimate.serving_profiles import serving_profile
from datarax.estimate.serving_recommend import recommend_serving
from datarax.hardware.chips import get_hardware
from datarax.hardware.topology import plan_hardware_devices
from datarax.specs.model_specs import model_spec

IO = {"input_tokens": 1000, "output_tokens": 1000}


def _spec(name: str):
    return model_spec({"name": name})


# Llama 3.1: 8 kv heads of 128; 8B has 32 layers, 70B 80 (model cards). DeepSeek-V3: 61
# layers caching a 512-wide latent and a 64-wide rope key (its technical report, sec 2.1.1).
KV_CASES = [
    # (id, model, tensor, stage, kv_dtype, bytes per token per device)
    ("8b-bf16", "llama3.1-8b", 1, 1, "bfloat16", 2 * 8 * 128 * 32 * 2),
    ("8b-tp8", "llama3.1-8b", 8, 1, "bfloat16", 2 * 1 * 128 * 32 * 2),
    ("8b-tp16-replicated", "llama3.1-8b", 16, 1, "bfloat16", 2 * 1 * 128 * 32 * 2),
    ("70b-bf16", "llama3.1-70b", 1, 1, "bfloat16", 2 * 8 * 128 * 80 * 2),
    ("70b-tp4-fp8", "llama3.1-70b", 4, 1, "float8", 2 * 2 * 128 * 80 * 1),
    ("70b-tp8-stage2", "llama3.1-70b", 8, 2, "bfloat16", 2 * 1 * 128 * 40 * 2),
    ("70b-int8-scales", "llama3.1-70b", 8, 1, "int8", 2 * 1 * (128 + 2) * 80),
    ("dsv3-mla", "deepseek3-671b", 1, 1, "bfloat16", (512 + 64) * 61 * 2),
    ("dsv3-mla-tp8-whole", "deepseek3-671b", 8, 1, "bfloat16", (512 + 64) * 61 * 2),
    ("dsv3-mla-fp8-stage4", "deepseek3-671b", 1, 4, "float8", (512 + 64) * 16),
]


@pytest.mark.parametrize(
    ("model", "tensor", "stage", "kv_dtype", "expected"),
    [case[1:] for case in KV_CASES],
    ids=[case[0] for case in KV_CASES],
)
def test_kv_bytes_per_token_by_hand(model, tensor, stage, kv_dtype, expected):
    layout = ServingLayout(tensor=tensor, stage=stage)
    assert kv_bytes_per_token(_spec(model), layout, kv_dtype) == expected


def _llama_8b_weights(per_weight: float, scale_per_output: float, group: int | None) -> float:
    """Llama 3.1 8B's weights by hand: per layer q, o [4096, 4096], k, v [4096, 1024],
    gate, up [4096, 14336], down [14336, 4096] at the quantized dtype (scales per output
    channel, or per group of inputs), two 4096-wide norms; embedding and unembedding
    [128256, 4096] and the final norm in bfloat16."""
    mats = [(4096, 4096), (4096, 1024), (4096, 1024), (4096, 4096),
            (4096, 14336), (4096, 14336), (14336, 4096)]  # fmt: skip
    layer = 0.0
    for fan_in, fan_out in mats:
        scales = fan_out * (fan_in / group if group else 1)
        layer += fan_in * fan_out * per_weight + scales * scale_per_output
    layer += 2 * 4096 * 2
    return 32 * layer + 2 * 128256 * 4096 * 2 + 4096 * 2


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        ("bfloat16", _llama_8b_weights(2, 0, None)),
        ("float8", _llama_8b_weights(1, 4, None)),
        ("int8", _llama_8b_weights(1, 4, None)),
        ("int4", _llama_8b_weights(0.5, 2.5, 128)),
    ],
    ids=["bfloat16", "float8", "int8", "int4"],
)
def test_weights_per_dtype_by_hand(dtype, expected):
    got = weights_bytes_per_device(_spec("llama3.1-8b"), ServingLayout(), dtype)
    assert got == pytest.approx(expected, rel=1e-9)
    if dtype == "bfloat16":  # 2 bytes a parameter, every parameter
        assert got == 2 * _spec("llama3.1-8b").param_count()


def test_tensor_splits_weights_and_replicates_kv_heads_past_kv_heads():
    spec = _spec("llama3.1-8b")
    whole = weights_bytes_per_device(spec, ServingLayout(), "bfloat16")
    tp8 = weights_bytes_per_device(spec, ServingLayout(tensor=8), "bfloat16")
    tp16 = weights_bytes_per_device(spec, ServingLayout(tensor=16), "bfloat16")
    assert tp8 == pytest.approx(whole / 8, rel=1e-3)
    # at 16, k and v keep one whole head a device: 2 x 32 layers x [4096, 128] more than /16
    # and the norm scales (2 a layer and the final one, 4096 wide) stay whole
    kv_whole = 2 * 32 * 4096 * 128 * 2
    norms = (2 * 32 + 1) * 4096 * 2
    extra = kv_whole - 2 * 32 * 4096 * 1024 * 2 / 16 + norms * 15 / 16
    assert tp16 - whole / 16 == pytest.approx(extra, rel=1e-9)


def test_max_batch_is_what_the_kv_cache_holds():
    spec, hw = _spec("llama3.1-8b"), get_hardware("h100-sxm")
    options = ServingOptions(**IO)
    cap = serving_capacity(spec, hw, ServingLayout(), options)
    usable = int(hw.hbm_bytes * 0.9)
    free = usable - cap.memory.weights - cap.memory.activations
    assert cap.kv_capacity_tokens == free // 131072
    assert cap.max_batch == cap.kv_capacity_tokens // 2000 == cap.batch
    assert cap.memory.total <= cap.memory.usable and cap.memory.fits
    # the request's max_batch and the replica's share of concurrency cap the priced batch
    assert serving_capacity(spec, hw, ServingLayout(), ServingOptions(**IO, max_batch=7)).batch == 7
    shared = ServingOptions(**IO, concurrency=10)
    assert serving_capacity(spec, hw, ServingLayout(replicas=4), shared).batch == 3


def test_a_model_too_large_for_the_chip_does_not_fit():
    plan = estimate_serving("h100-sxm", [], {"name": "llama3.1-70b"}, IO)
    assert not plan.memory_per_device.fits
    assert plan.serving_estimate.max_batch == 0


def _nominal(hw: str):
    """A profile at the hardware's full figures, no fixed costs: the physics alone."""
    profile = serving_profile(get_hardware(hw), "vllm")
    return replace(profile, constants=CalibrationConstants(1.0, 1.0, 1.0, 1.0, 0.0, "nominal"))


def _links(hw: str, ici: dict[str, int], **where):
    return plan_hardware_devices(hw, ici=ici, **where).axes_detail


def test_ttft_and_tpot_grow_with_batch_and_prompt():
    links = _links("h100-sxm", {"data": 1, "tensor": 8}, hosts=1)
    tpots, ttfts = [], []
    for batch in (1, 8, 64, 256):
        est = estimate_serving(
            "h100-sxm", links, {"name": "llama3.1-70b"}, {**IO, "max_batch": batch}
        ).serving_estimate
        assert est.batch == batch
        tpots.append(est.tpot_s)
        ttfts.append(est.ttft_s)
    assert tpots == sorted(tpots) and tpots[0] < tpots[-1]
    short = estimate_serving(
        "h100-sxm",
        links,
        {"name": "llama3.1-70b"},
        {"input_tokens": 100, "output_tokens": 100, "max_batch": 1},
    )
    long = estimate_serving(
        "h100-sxm",
        links,
        {"name": "llama3.1-70b"},
        {"input_tokens": 4000, "output_tokens": 100, "max_batch": 1},
    )
    # 40x the prompt: the short one reads the weights once, the long one is compute-bound
    assert long.serving_estimate.ttft_s > 5 * short.serving_estimate.ttft_s


def test_decode_at_small_batch_is_memory_bound_and_tensor_parallel_faster():
    one = estimate_serving("h100-sxm", [], {"name": "llama3.1-8b"}, {**IO, "max_batch": 1})
    est = one.serving_estimate
    assert est.bottleneck == "memory"
    # at the chip's full figures a decode step is its reads: the 16 GB of weights and one
    # sequence's 1,500 cached tokens of 128 KiB at 3.35 TB/s
    physics = estimate_serving(
        "h100-sxm", [], {"name": "llama3.1-8b"}, {**IO, "max_batch": 1},
        calibration=_nominal("h100-sxm"),
    ).serving_estimate  # fmt: skip
    reads = est.weights_bytes + 1500 * 131072
    assert physics.decode_step_s == pytest.approx(reads / 3.35e12, rel=0.02)
    # the shipped profile's share of the bandwidth and fixed step cost make it slower
    assert physics.decode_step_s < est.decode_step_s < 4 * physics.decode_step_s
    tp = estimate_serving(
        "h100-sxm", _links("h100-sxm", {"data": 1, "tensor": 8}, hosts=1),
        {"name": "llama3.1-8b"}, {**IO, "max_batch": 1},
    ).serving_estimate  # fmt: skip
    assert tp.tpot_s < est.tpot_s
    assert tp.output_tokens_per_s_per_device < est.output_tokens_per_s_per_device


def test_replicas_multiply_throughput():
    links = _links("h100-sxm", {"data": 8}, hosts=1)
    one = estimate_serving("h100-sxm", [], {"name": "llama3.1-8b"}, {**IO, "max_batch": 32})
    eight = estimate_serving("h100-sxm", links, {"name": "llama3.1-8b"}, {**IO, "max_batch": 32})
    assert eight.serving_estimate.replicas == 8
    assert eight.serving_estimate.output_tokens_per_s == pytest.approx(
        8 * one.serving_estimate.output_tokens_per_s
    )


def test_concurrency_beyond_the_slots_waits_for_its_first_token():
    few = estimate_serving(
        "h100-sxm", [], {"name": "llama3.1-8b"}, {**IO, "max_batch": 16, "concurrency": 16}
    ).serving_estimate
    many = estimate_serving(
        "h100-sxm", [], {"name": "llama3.1-8b"}, {**IO, "max_batch": 16, "concurrency": 64}
    ).serving_estimate
    assert few.batch == many.batch == 16
    assert many.output_tokens_per_s == pytest.approx(few.output_tokens_per_s)
    # 48 clients queue: about three requests' service time each
    assert many.ttft_s > few.ttft_s + 2 * 1000 * few.tpot_s


def test_moe_decode_reads_only_the_experts_it_reaches():
    assert reached_experts(256, 8, 1) == pytest.approx(8)
    assert reached_experts(8, 2, 1000) == pytest.approx(8)
    assert reached_experts(256, 8, 4) == pytest.approx(256 * (1 - (1 - 8 / 256) ** 4))
    links = _links("h200-sxm", {"data": 1, "expert": 8}, hosts=1)
    plan = {"name": "deepseek3-671b"}
    # at the bandwidth's full speed, no fixed costs: a step is its reads
    roofline = _nominal("h200-sxm")
    small = estimate_serving("h200-sxm", links, plan, {**IO, "max_batch": 1, "weight_dtype":
                             "float8"}, calibration=roofline).serving_estimate  # fmt: skip
    big = estimate_serving("h200-sxm", links, plan, {**IO, "max_batch": 64, "weight_dtype":
                           "float8"}, calibration=roofline).serving_estimate  # fmt: skip
    # one token reads 8 of 256 experts: a step far cheaper than reading all the weights
    all_weights_s = small.weights_bytes / 4.8e12
    assert small.decode_step_s < all_weights_s / 2
    assert big.decode_step_s > small.decode_step_s


@pytest.mark.parametrize(
    ("ici", "code"),
    [({"fsdp": 8}, "invalid_parallelism"), ({"context": 8}, "invalid_parallelism"),
     ({"expert": 8}, "invalid_parallelism"), ({"tensor": 8, "data": 1}, None)],
    ids=["fsdp", "context", "expert-on-dense", "tensor"],
)  # fmt: skip
def test_serving_roles(ici, code):
    spec = _spec("llama3.1-8b")
    if code is None:
        assert serving_layout(spec, ici).tensor == 8
        return
    with pytest.raises(PlanError) as error:
        serving_layout(spec, ici)
    assert error.value.code == code


@pytest.mark.parametrize(
    "serving",
    [{**IO, "weight_dtype": "int3"}, {**IO, "kv_dtype": "int4"}, {**IO, "engine": "tgi"},
     {"input_tokens": 10}, {**IO, "max_model_len": 1999}, {**IO, "memory_fraction": 1.5}],
    ids=["weight-dtype", "kv-dtype", "engine", "no-output", "short-max-model-len", "fraction"],
)  # fmt: skip
def test_bad_serving_options_are_invalid_serving(serving):
    with pytest.raises(PlanError) as error:
        ServingOptions.from_json(serving)
    assert error.value.code == "invalid_serving"


def test_recommendation_ranks_by_tokens_per_device_and_says_why_others_fail():
    out = recommend_serving(
        "tpu-v5e", topology="4x4", model={"name": "llama3.1-8b"},
        serving={**IO, "concurrency": 64}, slo={"ttft_s": 1.0, "tpot_s": 0.04}, top_k=3,
    )  # fmt: skip
    assert out.candidates, out.rejected
    per_device = [c.serving_estimate.output_tokens_per_s_per_device for c in out.candidates]
    assert per_device == sorted(per_device, reverse=True)
    for candidate in out.candidates:
        est = candidate.serving_estimate
        assert est.ttft_s <= 1.0 and est.tpot_s <= 0.04
        assert candidate.memory_per_device.fits
    assert sum(out.rejected.values()) == len(out.rejections) < out.considered
    by_code = {r.code: r for r in out.rejections}
    # 7B at bf16 (13.5 GB) does not fit one 16 GB v5e with its cache: rejected as such
    assert "does_not_fit" in by_code and "cached tokens" in by_code["does_not_fit"].reason
    assert (
        "tensor_not_divisible" not in by_code or "heads" in by_code["tensor_not_divisible"].reason
    )
    missed = [r for r in out.rejections if r.code == "misses_slo"]
    assert all("> slo" in r.reason for r in missed)
    # the candidate's plan request plans it back
    assert out.candidates[0].plan_request["serving"]["concurrency"] == 64


def test_a_tight_slo_rejects_every_layout_with_its_reason():
    out = recommend_serving(
        "tpu-v5e", topology="2x4", model={"name": "llama2-7b"},
        serving={**IO, "concurrency": 64}, slo={"tpot_s": 1e-4}, top_k=3,
    )  # fmt: skip
    assert out.candidates == [] and out.note
    missed = [r for r in out.rejections if r.code == "misses_slo"]
    assert missed and all("tpot_s" in r.reason and "> slo 0.0001 s" in r.reason for r in missed)


def test_nothing_fits_is_no_plan_fits():
    with pytest.raises(PlanError) as error:
        recommend_serving("tpu-v5e", topology="2x2", model={"name": "llama3.1-405b"},
                          serving=IO)  # fmt: skip
    assert error.value.code == "no_plan_fits"
    assert "more devices" in error.value.message


def test_recommendation_over_slices_puts_replicas_or_stages_across_them():
    out = recommend_serving(
        "tpu-v5e", topology="2x4", slices=2, model={"name": "llama3.1-8b"},
        serving={**IO, "concurrency": 32}, top_k=3,
    )  # fmt: skip
    assert out.candidates
    for candidate in out.candidates:
        dcn = candidate.dcn
        assert dcn["tensor"] == 1 and dcn["data"] * dcn["stage"] == 2
        assert candidate.plan_request["slices"] == 2
        assert candidate.plan_request["dcn"] == dcn
    # tensor and expert never cross the slow network
    assert all(r.dcn["tensor"] == 1 for r in out.rejections)
    with pytest.raises(PlanError) as error:
        recommend_serving("tpu-v5e", topology="2x4", slices=0, model={"name": "llama3.1-8b"},
                          serving=IO)  # fmt: skip
    assert error.value.code == "invalid_slice_count"
