"""Per-device memory of one training step (datarax.estimate.memory): state, activations
and temporaries by role, VMEM, the transposed update's copies and the usable HBM."""

from __future__ import annotations

import pytest

from datarax.estimate.cost import estimate_step
from datarax.estimate.memory import memory_estimate
from datarax.hardware.chips import AxisLink, get_hardware
from datarax.hardware.topology import plan_hardware_devices
from datarax.parallel.axis_roles import axis_roles, param_specs
from datarax.specs.flops import recompute_flops_per_token
from datarax.specs.model_specs import model_spec
from tests.datarax.estimate.test_cost import D_FF, D_MODEL, MLP_BLOCK, TRANSFORMER


def test_remat_trades_activation_memory_for_a_second_forward():
    layout = plan_hardware_devices("tpu-v5e", topology="2x4", ici={"data": 8})
    deep = {**TRANSFORMER, "layers": 24}
    none = estimate_step("tpu-v5e", layout.axes_detail, deep, 16)
    full = estimate_step("tpu-v5e", layout.axes_detail, {**deep, "remat": "full"}, 16)
    assert full["flops"] == none["flops"]
    # remat full recomputes every forward matmul the backward pass reads: all but the
    # down projection (its output only enters the residual sum), and the attention
    spec = model_spec({**deep, "remat": "full"})
    matmul, attention = recompute_flops_per_token(spec)
    d, f, hd = spec.d_model, spec.d_ff, spec.head_dim
    per_layer = 2 * d * (spec.heads + 2 * spec.kv_heads) * hd + 2 * spec.heads * hd * d
    assert matmul == spec.layers * (per_layer + 2 * 2 * d * f)
    assert attention == spec.layers * 4 * spec.seq_len * spec.heads * hd
    roof = {e: sum(p["compute_s"] for p in est["phases"].values()) for e, est in
            (("none", none), ("full", full))}  # fmt: skip
    tokens = 16 * spec.seq_len / 8
    assert roof["full"] - roof["none"] == pytest.approx(matmul * tokens / 1.97e14)
    assert full["step_s"] > none["step_s"]
    # the library's own step keeps every layer's activations at remat none
    mem = {r: memory_estimate({**deep, "remat": r}, {"data": 8}, 16) for r in ("none", "full")}
    assert mem["full"]["activations"] < mem["none"]["activations"] / 2
    assert mem["none"]["program"] == "datarax"
    # a hardware plan prices MaxText's program, whose decoder wraps each layer in
    # jax.checkpoint with policy None at remat_policy=none: full rematerialization
    assert full.memory_per_device.total == none.memory_per_device.total
    assert none.memory_per_device.program == "maxtext"


def test_activation_count_matches_korthikanti_without_dropout():
    # Korthikanti et al. 2022 (https://arxiv.org/abs/2205.05198) eq. 2: one layer keeps
    # s*b*(34h + 5as) bytes at 16 bits. Its dropout parts are the masks (h + as + h bytes,
    # one byte each) and the attention dropout's output (2as): without dropout 32h + 2as
    # bytes per token, i.e. 16h + as elements; our count must be exactly that.
    h, a, s = 1024, 16, 2048
    spec = model_spec(
        {**TRANSFORMER, "layers": 1, "d_model": h, "d_ff": 4 * h, "heads": a, "kv_heads": a,
         "seq_len": s, "vocab": 8, "mlp": "plain", "attention": "dot"}
    )  # fmt: skip
    per_layer = spec.activation_elements_per_token(1) - (8 + h)  # minus logits, final norm
    korthikanti_bytes = 34 * h + 5 * a * s - (2 * h + a * s) - 2 * a * s
    assert 2 * per_layer == korthikanti_bytes


def test_memory_sharding_by_role():
    spec = model_spec(TRANSFORMER)
    axes = {"data": 2, "fsdp": 2, "tensor": 2}
    roles = axis_roles(list(axes))
    specs = {g.path: (spec_, shard) for g, spec_, shard, _ in param_specs(spec, axes, roles)}
    assert specs["layers/*/attn/q"] == (("fsdp", "tensor"), (256, 256))
    assert specs["layers/*/attn/o"] == (("tensor", "fsdp"), (256, 256))
    assert specs["embed/embedding"] == (("tensor", "fsdp"), (16000, 256))
    mem = memory_estimate(spec, axes, 8, hbm_bytes=16 * 2**30)
    norms = (2 * 4 + 1) * 512  # split over fsdp only
    assert mem["params"] == 2 * ((spec.param_count() - norms) // 4 + norms // 2)
    assert mem["optimizer"] == 2 * mem["params"]
    assert mem["batch"] == 2 * 8 * 1024
    assert mem["fits"] is True


def test_transformer_peak_takes_the_larger_of_loss_and_layer_transients():
    # data-parallel only: no gathered parameter, temporaries are the phase transient alone
    axes = {"data": 2}
    short = {**TRANSFORMER, "vocab": 32000, "seq_len": 256}
    tokens = 256  # 2 sequences over 2 devices
    mem = memory_estimate(short, axes, 2)
    # the loss's backward pass: one tile's bf16 logits and their bf16 gradient
    assert mem["temporaries"] == tokens * 2 * 2 * 32000
    tiled = memory_estimate({**short, "vocab_tiling": 4}, axes, 2)
    assert tiled["temporaries"] == tokens * 2 * 2 * 32000 // 4
    long = {**TRANSFORMER, "vocab": 64, "seq_len": 8192, "attention": "dot"}
    spec = model_spec(long)
    tokens = 8192
    d = spec.d_model
    head = 2 * 4 * d + 2 * 2 * d + 4 + 4  # the final norm, log-sum-exp, target index
    mem = memory_estimate(long, axes, 2)
    # the scores' float32 gradient of one layer; the head's residuals are gone by then
    assert mem["temporaries"] == tokens * (4 * spec.heads * 8192 - head)
    # under a remat policy the layer is recomputed first, with its whole residual set
    full = memory_estimate({**long, "attention": "flash", "remat": "full"}, axes, 2)
    hd, f = spec.head_dim, spec.d_ff
    layer = 2 * (2 * 4 * d + 2 * 2 * d) + 2 * (3 * spec.heads * hd + 2 * spec.kv_heads * hd)
    layer += 4 * spec.heads + 6 * 2 * f
    assert full["temporaries"] == tokens * (layer - head)


SMALL_MLP = {"kind": "mlp", "features": [1024, 4096, 1024], "dtype": "bfloat16"}


MIB = 2**20


def test_mlp_counts_the_widest_hidden_activation_gradient():
    # data-parallel only: no gathered parameter; temporaries are the hidden gradient
    mem = memory_estimate(MLP_BLOCK, {"data": 2}, 16)
    assert mem["temporaries"] == 8 * 2 * D_FF  # 8 examples per device, bf16
    # a col layer's output (the hidden) is split over tensor; no hidden layer, none
    mem = memory_estimate(MLP_BLOCK, {"data": 2, "tensor": 4}, 16)
    assert mem["temporaries"] == 8 * 2 * D_FF // 4
    flat = {**MLP_BLOCK, "features": [D_MODEL, D_MODEL]}
    assert memory_estimate(flat, {"data": 2}, 16)["temporaries"] == 0


def test_working_set_that_fits_in_vmem_leaves_hbm_the_arguments():
    # v5e data8 [1024, 4096, 1024], batch 512: XLA's HBM figure 49.60 MiB, arguments
    # 48.53 MiB (benchmarks/compile_checks.py)
    vmem = get_hardware("tpu-v5e").vmem_bytes
    hbm_only = memory_estimate(SMALL_MLP, {"data": 8}, 512)
    mem = memory_estimate(SMALL_MLP, {"data": 8}, 512, vmem_bytes=vmem)
    args = mem["params"] + mem["optimizer"] + mem["batch"]
    working = hbm_only["grads"] + hbm_only["activations"] + hbm_only["temporaries"]
    assert working <= vmem
    assert mem["total"] == args + MIB  # the arguments and the small remainder
    assert mem["vmem"] == working and hbm_only["vmem"] == 0
    assert mem["grads"] == mem["activations"] == 0 and mem["temporaries"] == MIB
    assert mem["total"] == sum(
        mem[k] for k in ("params", "grads", "optimizer", "activations", "batch", "temporaries")
    )
    assert abs(mem["total"] - 49.60 * MIB) / (49.60 * MIB) < 0.10


def test_working_set_larger_than_vmem_stays_in_hbm():
    # v5p data8 [2048, 8192, 2048], batch 1024: a ~70 MiB working set, above one v5p
    # core's 64 MiB VMEM; XLA keeps it in HBM
    model = {**SMALL_MLP, "features": [2048, 8192, 2048]}
    vmem = get_hardware("tpu-v5p").vmem_bytes
    mem = memory_estimate(model, {"data": 8}, 1024, vmem_bytes=vmem)
    assert mem == {**memory_estimate(model, {"data": 8}, 1024), "vmem": 0}
    assert mem["grads"] + mem["activations"] + mem["temporaries"] > vmem


def test_gradients_reduced_over_dcn_stay_in_hbm():
    # data over 2 slices: the gradients and their received copy go through the NIC (HBM)
    vmem = get_hardware("tpu-v5e").vmem_bytes
    ici = memory_estimate(SMALL_MLP, {"data": 8}, 512, vmem_bytes=vmem)
    dcn = memory_estimate(SMALL_MLP, {"data": 8}, 512, vmem_bytes=vmem, dcn_axes=["data"])
    assert dcn["grads"] == dcn["params"]
    assert dcn["total"] == ici["total"] + 2 * dcn["params"]
    # a tensor axis across DCN reduces no gradient
    axes = {"data": 4, "tensor": 2}
    base = memory_estimate(SMALL_MLP, axes, 512, vmem_bytes=vmem)
    assert memory_estimate(SMALL_MLP, axes, 512, vmem_bytes=vmem, dcn_axes=["tensor"]) == base


def test_estimate_step_applies_the_catalogs_vmem_on_tpu_only():
    layout = plan_hardware_devices("tpu-v5e", topology="2x4", ici={"data": 8})
    est = estimate_step("tpu-v5e", layout.axes_detail, SMALL_MLP, 512).memory_per_device
    assert est["vmem"] > 0 and est["activations"] == 0
    link = AxisLink("data", 8, 8, 1, "nvlink", 4.5e11)
    gpu = estimate_step("h100-sxm", [link], SMALL_MLP, 512).memory_per_device
    assert gpu["vmem"] == 0 and gpu["activations"] > 0


GIB = 2**30


V6E = get_hardware("tpu-v6e")


def _square(side: int) -> dict:
    return {"kind": "mlp", "features": [side, side], "dtype": "bfloat16"}


def _v6e(model, axes, batch, optimizer="adam", copies=True):
    return memory_estimate(
        model, axes, batch, optimizer=optimizer, hbm_bytes=V6E.hbm_bytes,
        vmem_bytes=V6E.vmem_bytes, update_layout_copies=copies,
    )  # fmt: skip


def test_transposed_update_adds_the_first_kernel_and_its_moments_copies():
    # v6e data8 [32768, 32768], Adam: XLA's HBM figure is 14.00 GiB, 7 kernels of 2 GiB:
    # the kernel and its two moments (arguments), its gradient, and three copies
    kernel = 32768 * 32768 * 2
    plain = _v6e(_square(32768), {"data": 8}, 64, copies=False)
    mem = _v6e(_square(32768), {"data": 8}, 64)
    assert plain["layout_copies"] == 0 and plain["total"] < 4.01 * kernel
    assert mem["layout_copies"] == 3 * kernel and mem["temporaries"] == 3 * kernel
    assert mem["grads"] == kernel and mem["activations"] == 0
    arguments = mem["params"] + mem["optimizer"] + mem["batch"]
    assert mem["total"] == arguments + 4 * kernel
    assert abs(mem["total"] - 14.00 * GIB) / (14.00 * GIB) < 0.01
    # SGD: no moments, the kernel's copy only (6.00 GiB from XLA)
    sgd = _v6e(_square(32768), {"data": 8}, 64, optimizer="sgd")
    assert sgd["layout_copies"] == kernel
    assert abs(sgd["total"] - 6.00 * GIB) / (6.00 * GIB) < 0.01


def test_transposed_update_near_the_hbm_keeps_one_copy_fewer():
    # three copies would pass 90% of v6e's 32 GiB: XLA rematerializes one (27.00 GiB)
    kernel = 49152 * 49152 * 2
    mem = _v6e(_square(49152), {"data": 8}, 64)
    assert mem["layout_copies"] == 2 * kernel
    assert abs(mem["total"] - 27.00 * GIB) / (27.00 * GIB) < 0.01
    # just under the line all three stay (XLA: 28.74 GiB)
    below = _v6e(_square(46912), {"data": 8}, 64)
    assert below["layout_copies"] == 3 * 46912 * 46912 * 2
    # SGD's single copy is never taken off (v6e [73728, 73728]: 30.38 GiB)
    sgd = _v6e(_square(73728), {"data": 8}, 64, optimizer="sgd")
    assert sgd["layout_copies"] == 73728 * 73728 * 2


def test_transposed_update_under_fsdp_sits_beside_the_whole_gradient():
    # fsdp8 [49152, 49152]: the kernel's whole gradient waits for its reduce-scatter
    # while the shard's copies are made (XLA: 8.44 GiB)
    shard = 49152 * 49152 * 2 // 8
    mem = _v6e(_square(49152), {"fsdp": 8}, 64)
    assert mem["layout_copies"] == 3 * shard
    assert mem["temporaries"] == 8 * shard + 3 * shard and mem["grads"] == shard
    assert abs(mem["total"] - 8.441 * GIB) / (8.441 * GIB) < 0.01


def test_transposed_update_is_not_the_peak_everywhere():
    # the backward pass is larger (fsdp16 [8192, 32768, 8192], batch 16384), the copies
    # fit in VMEM ([1024, 4096, 1024]), a transformer (stacked layers: no copies), or
    # the generation has none (v5e)
    big = {"kind": "mlp", "features": [8192, 32768, 8192], "dtype": "bfloat16"}
    assert _v6e(big, {"fsdp": 16}, 16384) == _v6e(big, {"fsdp": 16}, 16384, copies=False)
    assert _v6e(SMALL_MLP, {"data": 8}, 1024)["layout_copies"] == 0
    tf = {"kind": "transformer", "layers": 2, "d_model": 1024, "d_ff": 4096, "heads": 8,
          "kv_heads": 8, "vocab": 32000, "seq_len": 128}  # fmt: skip
    assert _v6e(tf, {"data": 8}, 8) == _v6e(tf, {"data": 8}, 8, copies=False)
    assert not get_hardware("tpu-v5e").update_layout_copies and V6E.update_layout_copies
    layout = plan_hardware_devices("tpu-v6e", topology="2x4", ici={"data": 8})
    est = estimate_step("tpu-v6e", layout.axes_detail, _square(32768), 64).memory_per_device
    assert est["layout_copies"] == 3 * 32768 * 32768 * 2


def test_fits_is_judged_on_the_hbm_xla_makes_available():
    # v5e: 16 GiB on the chip, 15.75 GiB for one program (XLA's OOM text)
    v5e = get_hardware("tpu-v5e")
    model = _square(46080)  # 4 x 46080^2 x 2 B = 15.82 GiB replicated
    kw = {"hbm_bytes": v5e.hbm_bytes, "vmem_bytes": v5e.vmem_bytes}
    nominal = memory_estimate(model, {"data": 4}, 64, **kw)
    usable = memory_estimate(model, {"data": 4}, 64, usable_hbm_bytes=v5e.usable_hbm_bytes, **kw)
    assert v5e.usable_hbm_bytes < usable["total"] < v5e.hbm_bytes
    assert nominal["fits"] is True and usable["fits"] is False
    assert usable["usable_hbm_bytes"] == v5e.usable_hbm_bytes
    assert nominal["usable_hbm_bytes"] == nominal["hbm_bytes"] == v5e.hbm_bytes
    layout = plan_hardware_devices("tpu-v5e", topology="2x2", ici={"data": 4})
    est = estimate_step("tpu-v5e", layout.axes_detail, model, 64).memory_per_device
    assert est["fits"] is False and est["usable_hbm_bytes"] == v5e.usable_hbm_bytes
