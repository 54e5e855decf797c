"""Step estimates: published rules of thumb reproduced from the catalog's figures.

The rules come from "How to Scale Your Model" (Austin et al., 2025,
https://jax-ml.github.io/scaling-book/): section "Training in Parallel" (data / FSDP on
TPU v5p compute-bound above C / W_ici = 4.59e14 / 1.8e11 ~ 2,550 tokens per chip on one
ICI axis, ~850 on three) and "How to Think About GPUs" (H100 data parallelism
compute-bound above C / W = 9.9e14 / 4.5e11 ~ 2,200 tokens per GPU in a node and
9.9e14 / 4e11 ~ 2,475 across nodes; tensor parallelism compute-bound while
Y < F * W / C, so comm-bound beyond ~8-way for F = 16,384). The book states the
large-ring limit; a ring of n devices moves (n - 1) / n of it, so each test undoes that
factor explicitly. Latencies are set to 0 with ``dataclasses.replace`` because the rules
are bandwidth-only; a separate test shows the latency term's effect.
"""

from __future__ import annotations

import dataclasses

import pytest

from datarax.errors import PlanError
from datarax.estimate.cost import (
    collective_seconds,
    estimate_step,
)
from datarax.hardware.chips import AxisLink, get_hardware
from datarax.hardware.topology import plan_hardware_devices
from datarax.specs.model_specs import model_spec

D_MODEL, D_FF = 4096, 16384
MLP_BLOCK = {"kind": "mlp", "features": [D_MODEL, D_FF, D_MODEL], "dtype": "bfloat16"}
TRANSFORMER = {
    "kind": "transformer",
    "layers": 4,
    "d_model": 512,
    "d_ff": 2048,
    "heads": 8,
    "kv_heads": 4,
    "vocab": 32000,
    "seq_len": 1024,
}


def no_latency(name: str):
    return dataclasses.replace(get_hardware(name), fast_link_latency_s=0.0, slow_link_latency_s=0.0)


def data_parallel_threshold(hw, axes_detail, global_batch: int) -> float:
    """Tokens per device where the backward pass's gradient all-reduce equals its compute."""
    est = estimate_step(hw, axes_detail, MLP_BLOCK, global_batch)
    backward = est["phases"]["backward"]
    per_token = backward["compute_s"] / est["tokens_per_device"]  # the roofline's
    return backward["comm_s"] / per_token


def test_v5p_data_parallel_one_ici_axis_is_compute_bound_above_2550_tokens():
    hw = no_latency("tpu-v5p")
    # data over one whole 16-chip torus axis (wraparound: 2 links of 9e10 B/s each way)
    layout = plan_hardware_devices(hw, topology="8x8x16", ici={"other": 64, "data": 16})
    assert layout.axes_physical["data"] == (1, 1, 16)
    data = [layout.axes_detail[1]]  # the data axis alone: a 16-way data-parallel group
    assert data[0].bytes_per_s == 2 * 9e10
    n = 16
    threshold = data_parallel_threshold(hw, data, global_batch=n * 4096)
    assert threshold * n / (n - 1) == pytest.approx(4.59e14 / 1.8e11, rel=1e-9)
    assert round(4.59e14 / 1.8e11) == 2550
    below = estimate_step(hw, data, MLP_BLOCK, n * int(0.9 * threshold))
    above = estimate_step(hw, data, MLP_BLOCK, n * int(1.1 * threshold))
    assert (below["bottleneck"], above["bottleneck"]) == ("communication", "compute")


def test_v5p_fsdp_over_three_ici_axes_is_compute_bound_above_850_tokens():
    hw = no_latency("tpu-v5p")
    layout = plan_hardware_devices(hw, topology="8x8x8", ici={"fsdp": 512})
    assert layout.axes_detail[0].bytes_per_s == 3 * 2 * 9e10
    n = 512
    est = estimate_step(hw, layout.axes_detail, MLP_BLOCK, global_batch=n * 1024)
    kinds = {(c["kind"], c["phase"]) for c in est["collectives"]}
    assert kinds == {
        ("all-gather", "forward"),
        ("all-gather", "backward"),
        ("reduce-scatter", "backward"),
    }
    backward = est["phases"]["backward"]
    # FSDP's backward moves an all-gather plus a reduce-scatter: an all-reduce's bytes,
    # so its roofline is data parallelism's (the book's point).
    threshold = backward["comm_s"] / (backward["compute_s"] / est["tokens_per_device"])
    assert threshold * n / (n - 1) == pytest.approx(4.59e14 / 5.4e11, rel=1e-9)
    assert round(4.59e14 / 5.4e11) == 850


def test_h100_data_parallel_in_a_node_is_compute_bound_above_2200_tokens():
    hw = no_latency("h100-sxm")
    layout = plan_hardware_devices(hw, hosts=1, ici={"data": 8})
    assert layout.axes_detail[0].link == "nvlink"
    threshold = data_parallel_threshold(hw, layout.axes_detail, global_batch=8 * 4096)
    assert threshold * 8 / 7 == pytest.approx(9.895e14 / 4.5e11, rel=1e-9)
    assert threshold * 8 / 7 == pytest.approx(2200, rel=1e-3)


def test_h100_data_parallel_across_nodes_is_compute_bound_above_2475_tokens():
    hw = no_latency("h100-sxm")
    nodes = 64
    layout = plan_hardware_devices(hw, hosts=nodes, ici={"data": 8}, dcn={"data": nodes})
    link = layout.axes_detail[0]
    assert (link.link, link.ici, link.dcn) == ("infiniband", 8, nodes)
    threshold = data_parallel_threshold(hw, layout.axes_detail, 8 * nodes * 4096)
    # the node's 4e11 B/s InfiniBand carries what its 8 GPUs reduce-scattered over NVLink
    assert threshold * nodes / (nodes - 1) == pytest.approx(9.895e14 / 4e11, rel=1e-9)
    assert threshold * nodes / (nodes - 1) == pytest.approx(2475, rel=1e-3)


def test_h100_tensor_parallelism_turns_comm_bound_beyond_8_way():
    hw = no_latency("h100-sxm")

    def forward_ratio(tensor: int, hosts: int) -> tuple[float, str]:
        if hosts == 1:
            layout = plan_hardware_devices(hw, hosts=1, ici={"data": 8 // tensor, "tensor": tensor})
        else:
            layout = plan_hardware_devices(
                hw, hosts=hosts, ici={"data": 1, "tensor": 8}, dcn={"tensor": hosts}
            )
        batch = layout.axes["data"] * 4096
        est = estimate_step(hw, layout.axes_detail, MLP_BLOCK, batch)
        forward = est["phases"]["forward"]
        return forward["comm_s"] / forward["compute_s"], est["bottleneck"]

    # comm / compute of a Megatron block is 2 (Y - 1) D C / (P W): linear in Y - 1
    r4, bound4 = forward_ratio(4, 1)
    r8, bound8 = forward_ratio(8, 1)
    assert r8 / r4 == pytest.approx(7 / 3, rel=1e-9)
    crossover = 1 + 7 / r8  # the Y where comm == compute
    book = D_FF * 4.5e11 / 9.895e14  # Y < F * W / C
    assert crossover - 1 == pytest.approx(book, rel=5e-4)  # biases add F + D to 2 D F
    assert 8 < crossover < 9
    _, bound16 = forward_ratio(16, 2)
    assert (bound4, bound8, bound16) == ("compute", "compute", "communication")


def test_latency_term_adds_alpha_per_ring_step():
    hw = get_hardware("tpu-v5e")
    link = AxisLink("data", 16, 16, 1, "ici", 9e10)
    t0 = collective_seconds("all-reduce", 0, link, hw)
    assert t0 == pytest.approx(2 * 15 * hw.fast_link_latency_s)
    t1 = collective_seconds("all-gather", 9e10, link, hw)
    assert t1 == pytest.approx(15 / 16 + 15 * hw.fast_link_latency_s)


def test_hierarchical_axis_costs_the_slower_of_its_two_rings():
    hw = no_latency("tpu-v5e")
    link = AxisLink("data", 512, 256, 2, "dcn", 2.5e10 / 8, ici_bytes_per_s=9e10)
    volume = 1e9
    ici = 2 * 255 / 256 * volume / 9e10
    dcn = 2 * 1 / 2 * (volume / 256) / (2.5e10 / 8)
    assert collective_seconds("all-reduce", volume, link, hw) == pytest.approx(max(ici, dcn))


def test_transformer_flops_are_6n_plus_attention():
    spec = model_spec(TRANSFORMER)
    layout = plan_hardware_devices("tpu-v5e", topology="2x4", ici={"data": 8})
    est = estimate_step("tpu-v5e", layout.axes_detail, spec, global_batch=16)
    tokens = 16 * 1024
    n_matmul = spec.param_count() - 32000 * 512 - (2 * 4 + 1) * 512
    # MaxText's count: QK^T and AV under the causal mask, half of 12 * L * S * H * hd
    attention = 6 * 4 * 1024 * 8 * 64 * tokens
    assert est["flops"] == 6 * n_matmul * tokens + attention
    roofline = sum(phase["compute_s"] for phase in est["phases"].values())
    assert roofline == pytest.approx(est["flops"] / 8 / 1.97e14)
    assert est["mfu"] == pytest.approx(est["flops"] / (8 * 1.97e14 * est["step_s"]))
    # the prediction is slower than the roofline, never faster
    assert est["step_s"] > est["roofline_s"] >= roofline


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"global_batch": 6}, "batch_not_divisible"),
        ({"global_batch": 8, "optimizer": "lion"}, "unknown_optimizer"),
        ({"global_batch": 8, "roles": {"data": "pipeline"}}, "unknown_axis_role"),
    ],
    ids=["batch", "optimizer", "role"],
)
def test_estimate_errors_carry_codes(kwargs, code):
    layout = plan_hardware_devices("tpu-v5e", topology="2x4", ici={"data": 4, "tensor": 2})
    with pytest.raises(PlanError) as err:
        estimate_step("tpu-v5e", layout.axes_detail, TRANSFORMER, **kwargs)
    assert err.value.code == code


def test_tensor_must_divide_heads():
    layout = plan_hardware_devices("tpu-v5e", topology="2x4", ici={"data": 1, "tensor": 8})
    with pytest.raises(PlanError) as err:
        estimate_step("tpu-v5e", layout.axes_detail, {**TRANSFORMER, "heads": 4}, 8)
    assert err.value.code == "tensor_not_divisible"
    assert "heads (4)" in err.value.message


def test_a3_high_data_parallel_across_nodes_reduces_over_a_quarter_of_the_bandwidth():
    # MaxText's A3 Llama 2 7B layout: fsdp 8 in a node, data over the nodes. The data
    # axis's gradient all-reduce crosses the nodes' network, 4e11 B/s on a DGX H100
    # (h100-sxm), 1e11 B/s on Google Cloud's A3 High: four times the seconds there.
    dgx, a3 = no_latency("h100-sxm"), no_latency("h100-a3-high")
    ici, dcn = {"data": 1, "fsdp": 8}, {"data": 16, "fsdp": 1}
    model = {**TRANSFORMER, "dtype": "float32"}

    def data_reduce(hw) -> tuple[float, str]:
        layout = plan_hardware_devices(hw, hosts=16, ici=ici, dcn=dcn)
        est = estimate_step(hw, layout.axes_detail, model, 16 * 8 * 4)
        (reduce,) = [c for c in est["collectives"] if c["axis"] == "data"]
        return reduce["seconds"], reduce["link"]

    (dgx_s, dgx_link), (a3_s, a3_link) = data_reduce(dgx), data_reduce(a3)
    assert (dgx_link, a3_link) == ("infiniband", "dcn")
    assert a3_s == pytest.approx(4 * dgx_s, rel=1e-9)
    assert get_hardware("h100-a3-high").peak_bf16_flops == get_hardware("h100-sxm").peak_bf16_flops
