"""Mixture-of-experts priced as it runs (issue 56, item 4): every collective kind priced by
its own volume on each link it crosses (ICI, DCN, NVLink, InfiniBand; volumes and seconds
computed by hand below from the catalog's figures), the experts' all-to-all exposed where
the schedule has nothing independent to hide it under, ``capacity_factor`` pricing padded
compute and saying what it drops, and PyTorch profiles sizing dispatch as Megatron does
and saying which optimizer sharding they price."""

from __future__ import annotations

import pytest

from datarax.estimate.cost import collective_seconds, estimate_step, step_warnings
from datarax.estimate.memory import dispatch_factor
from datarax.hardware.chips import get_hardware
from datarax.hardware.topology import plan_hardware_devices
from datarax.parallel.context import mesh_context
from datarax.parallel.options import ParallelOptions
from datarax.specs.model_specs import model_spec

V = 1e9  # bytes per device of each collective below

# The links, from the catalog (datarax/hardware/catalog.py): a v5p chip has 90 GB/s a
# direction on each ICI link and a ring over one wrapped torus dimension uses two; its
# host's DCN is 25 GB/s over 4 chips (6.25 GB/s a chip); an H100's NVLink egress is
# 450 GB/s, its host's InfiniBand 400 GB/s over 8 GPUs (50 GB/s a GPU). Latencies: 1 us a
# step on the fast networks, 10 us on the slow ones.
ICI, DCN, NVLINK, IB = 180e9, 6.25e9, 450e9, 50e9
FAST_A, SLOW_A = 1e-6, 1e-5


def _link(hardware: str, axis: str, **plan):
    layout = plan_hardware_devices(hardware, **plan)
    return next(link for link in layout.axes_detail if link.name == axis)


LINKS = {
    # 4 chips on one wrapped v5p dimension
    "ici": ("tpu-v5p", "expert", {"topology": "4x4x4", "ici": {"fsdp": 16, "expert": 4}}),
    # two v5p slices, one chip of each
    "dcn": ("tpu-v5p", "data", {"topology": "4x4x4", "slices": 2,
                                "ici": {"data": 1, "fsdp": 64}, "dcn": {"data": 2}}),
    # 4 chips of a slice x 2 slices
    "ici+dcn": ("tpu-v5p", "expert", {"topology": "4x4x4", "slices": 2,
                                      "ici": {"fsdp": 16, "expert": 4}, "dcn": {"expert": 2}}),
    "nvlink": ("h100-sxm", "expert", {"hosts": 1, "ici": {"expert": 8}}),
    "infiniband": ("h100-sxm", "data", {"hosts": 2, "ici": {"data": 1, "expert": 8},
                                        "dcn": {"data": 2}}),
    "nvlink+infiniband": ("h100-sxm", "expert", {"hosts": 2, "ici": {"expert": 8},
                                                 "dcn": {"expert": 2}}),
}  # fmt: skip

# (link, kind): seconds of one collective of V bytes a device, by hand:
# ring over n: (n - 1) / n * V / W + (n - 1) * alpha, twice for an all-reduce; over both
# networks the ICI ring over V and the DCN ring over V / ici, the slower; an all-to-all's
# (ici - 1) / n * V over the fast network and (dcn - 1) / dcn * V over the slow one, the
# slower; a send-recv V / W + alpha on the slowest network.
EXPECTED = {
    ("ici", "all-gather"): 3 / 4 * V / ICI + 3 * FAST_A,
    ("ici", "reduce-scatter"): 3 / 4 * V / ICI + 3 * FAST_A,
    ("ici", "all-reduce"): 2 * (3 / 4 * V / ICI + 3 * FAST_A),
    ("ici", "all-to-all"): 3 / 4 * V / ICI + 3 * FAST_A,
    ("ici", "send-recv"): V / ICI + FAST_A,
    ("dcn", "all-gather"): 1 / 2 * V / DCN + SLOW_A,  # 0.08001 s
    ("dcn", "reduce-scatter"): 1 / 2 * V / DCN + SLOW_A,
    ("dcn", "all-reduce"): 2 * (1 / 2 * V / DCN + SLOW_A),
    ("dcn", "all-to-all"): 1 / 2 * V / DCN + SLOW_A,
    ("dcn", "send-recv"): V / DCN + SLOW_A,
    # DCN part over V / 4 (0.02001 s) beats the ICI part (0.00417 s)
    ("ici+dcn", "all-gather"): 1 / 2 * (V / 4) / DCN + SLOW_A,
    ("ici+dcn", "reduce-scatter"): 1 / 2 * (V / 4) / DCN + SLOW_A,
    ("ici+dcn", "all-reduce"): 2 * (1 / 2 * (V / 4) / DCN + SLOW_A),
    # half of V goes to the other slice, whole: 0.08001 s, not 0.02001 s
    ("ici+dcn", "all-to-all"): 1 / 2 * V / DCN + SLOW_A,
    ("ici+dcn", "send-recv"): V / DCN + SLOW_A,
    ("nvlink", "all-gather"): 7 / 8 * V / NVLINK + 7 * FAST_A,
    ("nvlink", "reduce-scatter"): 7 / 8 * V / NVLINK + 7 * FAST_A,
    ("nvlink", "all-reduce"): 2 * (7 / 8 * V / NVLINK + 7 * FAST_A),
    ("nvlink", "all-to-all"): 7 / 8 * V / NVLINK + 7 * FAST_A,
    ("nvlink", "send-recv"): V / NVLINK + FAST_A,
    ("infiniband", "all-gather"): 1 / 2 * V / IB + SLOW_A,
    ("infiniband", "reduce-scatter"): 1 / 2 * V / IB + SLOW_A,
    ("infiniband", "all-reduce"): 2 * (1 / 2 * V / IB + SLOW_A),
    ("infiniband", "all-to-all"): 1 / 2 * V / IB + SLOW_A,
    ("infiniband", "send-recv"): V / IB + SLOW_A,
    # NVLink part (0.001951 s) beats the InfiniBand part over V / 8 (0.00126 s)
    ("nvlink+infiniband", "all-gather"): 7 / 8 * V / NVLINK + 7 * FAST_A,
    ("nvlink+infiniband", "reduce-scatter"): 7 / 8 * V / NVLINK + 7 * FAST_A,
    ("nvlink+infiniband", "all-reduce"): 2 * (7 / 8 * V / NVLINK + 7 * FAST_A),
    # half of V crosses InfiniBand: 0.01001 s
    ("nvlink+infiniband", "all-to-all"): 1 / 2 * V / IB + SLOW_A,
    ("nvlink+infiniband", "send-recv"): V / IB + SLOW_A,
}


def test_the_links_carry_the_catalogs_figures():
    widths = {"ici": ICI, "dcn": DCN, "ici+dcn": DCN, "nvlink": NVLINK, "infiniband": IB,
              "nvlink+infiniband": IB}  # fmt: skip
    classes = {"ici": "ici", "dcn": "dcn", "ici+dcn": "dcn", "nvlink": "nvlink",
               "infiniband": "infiniband", "nvlink+infiniband": "infiniband"}  # fmt: skip
    for name, (hardware, axis, plan) in LINKS.items():
        link = _link(hardware, axis, **plan)
        assert (link.link, link.bytes_per_s) == (classes[name], widths[name]), name
    assert _link(*LINKS["ici+dcn"][:2], **LINKS["ici+dcn"][2]).ici_bytes_per_s == ICI
    assert _link(*LINKS["nvlink+infiniband"][:2], **LINKS["nvlink+infiniband"][2]).ici_bytes_per_s == NVLINK  # fmt: skip  # noqa: E501


@pytest.mark.parametrize(("where", "kind"), sorted(EXPECTED))
def test_every_collective_kind_is_priced_by_its_volume_on_each_link(where, kind):
    hardware, axis, plan = LINKS[where]
    link = _link(hardware, axis, **plan)
    seconds = collective_seconds(kind, V, link, get_hardware(hardware))
    assert seconds == pytest.approx(EXPECTED[(where, kind)], rel=1e-12)


def test_an_all_to_all_across_slices_is_not_divided_by_the_slice_share():
    # the case: the expert all-to-all over DCN priced as an all-reduce's share
    # (V / ici over DCN) was 4x too fast here; each device sends half of V to the other
    # slice, whole
    link = _link(*LINKS["ici+dcn"][:2], **LINKS["ici+dcn"][2])
    hw = get_hardware("tpu-v5p")
    a2a = collective_seconds("all-to-all", V, link, hw)
    gather = collective_seconds("all-gather", V, link, hw)
    assert a2a == pytest.approx(0.08001) and gather == pytest.approx(0.02001)


MOE = {"kind": "transformer", "layers": 4, "d_model": 1024, "d_ff": 4096, "heads": 8,
       "kv_heads": 8, "vocab": 32000, "seq_len": 4096, "num_experts": 8,
       "experts_per_token": 2, "moe_d_ff": 2048}  # fmt: skip


def test_the_expert_all_to_all_of_a_step_crosses_dcn_with_its_own_volume():
    plan = LINKS["ici+dcn"][2]
    links = plan_hardware_devices("tpu-v5p", **plan).axes_detail
    # 128 sequences over fsdp 16 x expert 8: one a device, 4096 tokens
    est = estimate_step("tpu-v5p", links, MOE, global_batch=128)
    a2a = [c for c in est["collectives"] if c["kind"] == "all-to-all"]
    assert {(c["axis"], c["phase"], c["link"]) for c in a2a} == {
        ("expert", "forward", "dcn"), ("expert", "backward", "dcn")}  # fmt: skip
    one = 4096 * 2 * 1024 * 2  # tokens x k x d x bf16: 16 MiB an op
    for c in a2a:
        assert c["count"] == 8 and c["bytes_per_device"] == 8 * one  # 4 layers, both ways
        # half of each op to the other slice at 6.25 GB/s, plus one DCN step's latency
        assert c["seconds"] == pytest.approx(8 * (one / 2 / DCN + SLOW_A))


def _a2a(est, phase):
    return sum(c["seconds"] for c in est["collectives"]
               if c["kind"] == "all-to-all" and c["phase"] == phase)  # fmt: skip


def test_the_forward_all_to_all_is_exposed_without_independent_work():
    # one v5p slice, experts over 4 chips: compute far longer than the all-to-all, which
    # the old rule hid behind it entirely (exposed_comm_s 0.0)
    links = plan_hardware_devices(
        "tpu-v5p", topology="4x4x4", ici={"fsdp": 16, "expert": 4}
    ).axes_detail
    est = estimate_step("tpu-v5p", links, MOE, global_batch=64)
    fwd, bwd = _a2a(est, "forward"), _a2a(est, "backward")
    assert fwd > 0 and est["compute_s"] > 5 * (fwd + bwd)
    # the router feeds the dispatch, the dispatch the experts, the experts the combine:
    # no shared experts, nothing in the forward pass hides it
    assert est["breakdown"]["exposed_comm_s"] >= fwd
    # the backward pass's weight gradients of the experts hide up to overlap (0.4) of them
    parts = est.predicted_components
    assert parts["indep_gmm_bwd"] == pytest.approx(parts["gmm_bwd"] / 2)
    # a shared expert reads the layer's input, not the dispatched tokens: it hides part
    shared = estimate_step("tpu-v5p", links, {**MOE, "shared_experts": 1}, global_batch=64)
    assert _a2a(shared, "forward") == pytest.approx(fwd)
    assert shared.predicted_components["indep_mm_fwd"] > 0
    assert shared["breakdown"]["exposed_comm_s"] < est["breakdown"]["exposed_comm_s"]


def _ctx(model, axes, batch, **options):
    return mesh_context(model_spec(model), axes, batch, options=ParallelOptions(**options))


def test_capacity_pads_the_dense_kernels_compute_and_all_to_all_and_says_what_drops():
    links = plan_hardware_devices(
        "tpu-v5p", topology="4x4x4", ici={"fsdp": 16, "expert": 4}
    ).axes_detail
    one = {**MOE, "moe_kernel": "dense", "capacity_factor": 1.0}
    more = {**one, "capacity_factor": 1.25}
    a, b = (estimate_step("tpu-v5p", links, m, global_batch=64) for m in (one, more))
    assert b["step_s"] > a["step_s"] and b["flops"] == a["flops"]
    assert b.predicted_components["gmm_fwd"] == pytest.approx(
        1.25 * a.predicted_components["gmm_fwd"]
    )  # noqa: E501
    for phase in ("forward", "backward"):
        bytes_a = sum(c["bytes_per_device"] for c in a["collectives"]
                      if c["kind"] == "all-to-all" and c["phase"] == phase)  # fmt: skip
        bytes_b = sum(c["bytes_per_device"] for c in b["collectives"]
                      if c["kind"] == "all-to-all" and c["phase"] == phase)  # fmt: skip
        assert bytes_b == pytest.approx(1.25 * bytes_a)
    axes = {"fsdp": 16, "expert": 4}
    (said,) = step_warnings(_ctx(more, axes, 64), "tpu-v5p")
    # capacity: ceil(4096 x 2 / 8) x 1.25 = 1280 of a sequence's 8192 routed tokens
    assert "at most 1280 of a sequence's 8192" in said and "dropped" in said
    (short,) = step_warnings(_ctx({**one, "capacity_factor": 0.8}, axes, 64), "tpu-v5p")
    assert "at least 20% of the routed tokens" in short
    assert step_warnings(_ctx(MOE, axes, 64), "tpu-v5p") == []  # dropless, JAX: nothing


def test_a_capacity_the_sparse_kernel_does_not_read_is_said_so():
    # MaxText's sparse_matmul never reads capacity_factor (layers/moe.py at e591f30c)
    links = plan_hardware_devices(
        "tpu-v5p", topology="4x4x4", ici={"fsdp": 16, "expert": 4}
    ).axes_detail
    plain = estimate_step("tpu-v5p", links, MOE, global_batch=64)
    capped = {**MOE, "capacity_factor": 1.25}
    assert estimate_step("tpu-v5p", links, capped, global_batch=64)["step_s"] == plain["step_s"]
    (said,) = step_warnings(_ctx(capped, {"fsdp": 16, "expert": 4}, 64), "tpu-v5p")
    assert "not read by MaxText's sparse kernel" in said and "moe_kernel 'dense'" in said


GPU_PLAN = {"hosts": 2, "ici": {"data": 1, "expert": 8}, "dcn": {"data": 2}}


def test_a_pytorch_profile_sizes_dispatch_by_the_routed_tokens():
    spec = model_spec(MOE)
    # MaxText's dropless receive buffer over 8 expert shards: min(8, 8 / 2) = 4x balanced
    assert dispatch_factor(spec, 8) == 4.0
    assert dispatch_factor(spec, 8, routed=True) == 1.0  # Megatron's: the routed tokens
    assert dispatch_factor(model_spec({**MOE, "capacity_factor": 1.5}), 8, routed=True) == 1.5
    links = plan_hardware_devices("h100-sxm", **GPU_PLAN).axes_detail
    jax = estimate_step("h100-sxm", links, MOE, 16, calibration="published-gpu-jax")
    torch = estimate_step("h100-sxm", links, MOE, 16, calibration="published-gpu-pytorch")
    mj, mt = jax.memory_per_device, torch.memory_per_device
    assert mt.params == mj.params
    assert mt.activations + mt.temporaries < mj.activations + mj.temporaries


def test_a_pytorch_profile_says_the_optimizer_sharding_it_prices():
    axes = {"data": 2, "expert": 8}
    plain = step_warnings(_ctx(MOE, axes, 16), "h100-sxm", "published-gpu-pytorch")
    assert any("Megatron's all-to-all dispatcher" in w for w in plain)
    assert any("whole on every data-parallel rank" in w for w in plain)
    zero1 = step_warnings(
        _ctx(MOE, axes, 16, shard_over_data=True), "h100-sxm", "published-gpu-pytorch"
    )
    assert any("distributed optimizer (ZeRO-1)" in w and "(data)" in w for w in zero1)
    fsdp = step_warnings(_ctx(MOE, {"fsdp": 16}, 16), "h100-sxm", "published-gpu-pytorch")
    assert any("sharded with the parameters over fsdp" in w for w in fsdp)
    assert step_warnings(_ctx(MOE, axes, 16), "h100-sxm") == []  # the JAX profile


def test_a_hardware_plan_carries_the_estimates_warnings(api):
    body = {"hardware": "h100-sxm", "hosts": 2, "ici": {"data": 1, "expert": 8},
            "dcn": {"data": 2}, "batch_shape": [16, 4096],
            "model": {**MOE, "moe_kernel": "dense", "capacity_factor": 1.25},
            "calibration": "published-gpu-pytorch"}  # fmt: skip
    response = api.post("/v1/meshes", json=body)
    assert response.status_code == 201, response.text
    warnings = response.json()["warnings"]
    assert any("capacity_factor 1.25" in w and "dropped" in w for w in warnings), warnings
    assert any("optimizer state priced" in w for w in warnings), warnings
