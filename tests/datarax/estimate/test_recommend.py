"""Mesh recommendations: enumeration, rejection counts, ranking, plan requests that the
planner accepts, the nothing-fits explanation, and the 65,536-device speed."""

from __future__ import annotations

import pytest

from datarax.answers.estimates import Recommendations
from datarax.errors import PlanError
from datarax.estimate.cost import estimate_step
from datarax.estimate.recommend import factorisations, recommend_meshes
from datarax.hardware.topology import plan_hardware_devices

SMALL = {
    "kind": "transformer", "layers": 4, "d_model": 1024, "d_ff": 4096, "heads": 8,
    "kv_heads": 8, "vocab": 32000, "seq_len": 2048,
}  # fmt: skip
BIG = {
    "kind": "transformer", "layers": 32, "d_model": 4096, "d_ff": 14336, "heads": 32,
    "kv_heads": 8, "vocab": 128256, "seq_len": 4096,
}  # fmt: skip


def test_factorisations_are_every_ordered_product():
    assert factorisations(12, 2) == [(1, 12), (2, 6), (3, 4), (4, 3), (6, 2), (12, 1)]
    assert len(factorisations(256, 3)) == 45  # C(8 + 2, 2)
    assert all(a * b * c == 256 for a, b, c in factorisations(256, 3))


def test_every_candidate_is_counted_once_and_ranked_by_step_time():
    out = recommend_meshes(
        "tpu-v5e", topology="4x4", slices=2, model=SMALL, global_batch=64, top_k=10_000
    )
    assert out["considered"] == len(factorisations(16, 3)) * len(factorisations(2, 3))
    assert len(out["candidates"]) + sum(out["rejected"].values()) == out["considered"]
    steps = [c["step_estimate"]["step_s"] for c in out["candidates"]]
    assert steps == sorted(steps)
    assert [c["rank"] for c in out["candidates"]] == list(range(1, len(steps) + 1))
    best = out["candidates"][0]
    assert best["memory_per_device"]["fits"] is True
    assert best["dcn"]["tensor"] == 1  # tensor parallelism over DCN never wins


@pytest.mark.parametrize(
    "where",
    [{"topology": "4x4", "slices": 2}, {"topology": "2x2x2", "slices": 1}, {"hosts": 2}],
    ids=["v5e-2-slices", "v5p-cube", "h100-2-nodes"],
)
def test_plan_request_is_accepted_by_the_planner_and_prices_the_same(where):
    hardware = "h100-sxm" if "hosts" in where else ("tpu-v5p" if "x2x" in where["topology"]
                                                     else "tpu-v5e")  # fmt: skip
    out = recommend_meshes(hardware, **where, model=SMALL, global_batch=64, top_k=3)
    for cand in out["candidates"]:
        request = cand["plan_request"]
        assert request["hardware"] == hardware
        assert request["batch_shape"] == [64, 2048] and request["model"]["kind"] == "transformer"
        options = {k: request[k] for k in ("topology", "slices", "hosts") if k in request}
        layout = plan_hardware_devices(
            hardware, ici=request["ici"], dcn=request["dcn"], **options,
            allow_split_physical_axes=request.get("allow_split_physical_axes", False),
        )  # fmt: skip
        again = estimate_step(hardware, layout.axes_detail, request["model"], 64)
        assert again["step_s"] == pytest.approx(cand["step_estimate"]["step_s"], rel=1e-12)


def test_rejections_are_counted_by_code():
    out = recommend_meshes(
        "tpu-v5e",
        topology="2x4",
        model={**SMALL, "heads": 4, "kv_heads": 4},
        global_batch=4,
        top_k=100,
    )
    assert out["rejected"]["batch_not_divisible"] > 0  # data x fsdp = 8
    assert out["rejected"]["tensor_not_divisible"] > 0  # tensor = 8 > 4 heads
    assert out["candidates"]
    for cand in out["candidates"]:
        assert 4 % (cand["ici"]["data"] * cand["ici"]["fsdp"]) == 0 and cand["ici"]["tensor"] <= 4


def test_nothing_fits_says_what_would():
    with pytest.raises(PlanError) as err:  # activations too big: less batch
        recommend_meshes(
            "tpu-v5e",
            topology="2x4",
            model={**SMALL, "layers": 16, "attention": "dot"},
            global_batch=512,
        )
    assert err.value.code == "no_plan_fits"
    message = err.value.message
    assert "does_not_fit: " in message and "x the devices would hold it" in message
    # hardware plans price MaxText's program, whose remat_policy=none rematerializes as
    # full does (memory.maxtext_program_context): full is no way out
    assert "remat 'full' does not fit either" in message
    assert "a global_batch of 256 fits" in message


def test_model_too_big_for_the_cluster_asks_for_devices():
    with pytest.raises(PlanError) as err:
        recommend_meshes(
            "tpu-v5e", topology="2x4", model={**BIG, "attention": "dot"}, global_batch=64
        )
    assert err.value.code == "no_plan_fits"
    # MaxText's program (remat_policy=none rematerializes as full does): 48.37 GiB
    # against the 15.75 GiB XLA lets one program allocate on a v5e
    assert "about 4x the devices" in err.value.message
    assert "HBM holds 15.75 GiB for one program" in err.value.message
    assert "remat 'full' does not fit either" in err.value.message


def test_indivisible_batch_everywhere_is_explained():
    with pytest.raises(PlanError) as err:
        recommend_meshes("h100-sxm", hosts=1, axes=["data", "fsdp"], model=SMALL,
                         global_batch=3)  # fmt: skip
    assert err.value.code == "no_plan_fits"
    assert "multiple of 8" in err.value.message


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"hardware": "tpu-v5e", "top_k": 0}, "invalid_top_k"),
        ({"hardware": "tpu-v5e", "axes": ["data", "pipeline"]}, "unknown_axis_role"),
        ({"hardware": "tpu-v5e", "axes": ["data", "diloco"]}, "invalid_parallelism"),
        ({"hardware": "tpu-v5e", "topology": None}, "missing_topology"),
        ({"hardware": "tpu-v7x"}, "unknown_hardware"),
        ({"hardware": "tpu-v5e", "model": {"kind": "rnn"}}, "invalid_model"),
    ],
    ids=["top_k", "role", "unpriced-kind", "topology", "hardware", "model"],
)
def test_bad_requests_carry_codes(kwargs, code):
    call = {"topology": "2x4", "model": SMALL, "global_batch": 8, **kwargs}
    with pytest.raises(PlanError) as err:
        recommend_meshes(call.pop("hardware"), **call)
    assert err.value.code == code


def test_65536_device_recommendation_considers_every_factorisation():
    # Its speed is measured by make bench (benchmarks/run.py), not asserted here.
    model = {**BIG, "remat": "full"}
    # One sequence per data x fsdp shard, tensor >= 2 splitting its float32 logits: at
    # 65,536 sequences (tensor 1) the smallest candidate needs 16.12 GiB of 16.
    out = recommend_meshes("tpu-v5e", topology="16x16", slices=256, model=model, global_batch=32768)
    assert out["considered"] == 45 * 45
    assert out["candidates"][0]["memory_per_device"]["fits"]


def test_tensor_or_expert_across_dcn_is_flagged_with_why_it_ranks_anyway():
    # every candidate of the whole search, best first: the ones putting tensor on DCN
    # carry a flag saying how they compare with the best that keeps tensor in a slice
    out = recommend_meshes(
        "tpu-v5e", topology="4x4", slices=2, model=SMALL, global_batch=64, top_k=10_000
    )
    on_fast = [c for c in out["candidates"] if c["dcn"]["tensor"] == 1]
    slow = [c for c in out["candidates"] if c["dcn"]["tensor"] > 1]
    assert on_fast and slow
    assert not any("flags" in c for c in on_fast)
    assert all(c.flags is None for c in on_fast) and all(c.flags for c in slow)
    # the answer as the service sends it: flags only where there are some, a note (fewer
    # than top_k came back), read back whole
    assert isinstance(out, Recommendations) and "of the top_k 10000" in out.to_json()["note"]
    assert Recommendations.from_json(out.to_json()).to_json() == out.to_json()
    best = on_fast[0]["step_estimate"]["step_s"]
    for c in slow:
        (flag,) = c["flags"]
        assert "tensor axis 'tensor' crosses the data-centre network (DCN) (2 ways)" in flag
        step = c["step_estimate"]["step_s"]
        if step <= best:
            assert f"is {best / step - 1:.0%} slower ({best:.4g} s a step)" in flag
        else:
            assert f"none: it is {step / best - 1:.0%} slower than the best" in flag
    # when only slow layouts are left, the flag says so
    out = recommend_meshes(
        "tpu-v5e", topology="4x4", slices=2, model=SMALL, global_batch=64,
        fixed_dcn={"data": 1, "fsdp": 1, "tensor": 2},
    )  # fmt: skip
    assert all("no candidate keeping tensor and expert axes" in c["flags"][0]
               for c in out["candidates"])  # fmt: skip
