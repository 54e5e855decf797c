"""Hardware plans price MaxText's program (DESIGN v1.4, "The program users launch"):
``memory_per_device.program`` says which program a plan's memory prices, and the
MaxText terms of :mod:`datarax.estimate.memory` (remat none as MaxText runs it, the
scanned MLP kernels' layer-major copies) against MaxText's compiled figures recorded by
``benchmarks/maxtext_memory.py`` (MaxText 0.2.5, libtpu 0.0.50.1; BENCHMARKS.md)."""

from __future__ import annotations

import pytest

from datarax.estimate.cost import estimate_step
from datarax.estimate.maxtext_memory import (
    maxtext_moe_layers_per_block,
    maxtext_pipeline_gathered,
    maxtext_scan_block,
    maxtext_scan_copies,
)
from datarax.estimate.memory import hardware_memory, memory_estimate, step_memory
from datarax.hardware.chips import get_hardware
from datarax.hardware.topology import plan_hardware_devices
from datarax.parallel.context import mesh_context
from datarax.parallel.options import ParallelOptions
from datarax.specs.model_specs import model_spec

# XLA's HBM allocation (total_allocation_bytes) of MaxText's compiled step, recorded
LLAMA2_V5E4 = 16_597_957_632  # Llama 2 7B, bf16 weights, fsdp 4, one 2,048-token sequence a chip
LLAMA3_V5E8 = 11_049_449_984  # Llama 3.1 8B, fsdp 8, one 2,048-token sequence a chip
LLAMA2 = {"name": "llama2-7b", "seq_len": 2048, "param_dtype": "bfloat16"}
LLAMA3 = {"name": "llama3.1-8b", "seq_len": 2048}


def _hardware_plan(model, topology, ici, batch, options=None):
    layout = plan_hardware_devices("tpu-v5e", topology=topology, ici=ici)
    return estimate_step(
        "tpu-v5e", layout.axes_detail, model, batch, options=options
    ).memory_per_device


@pytest.mark.parametrize("remat", ["none", "full"])
def test_the_issues_llama2_case_fits_as_maxtext_compiles_it(remat):
    # before: 31.8 GB at remat none (every layer's activations kept), judged not to fit
    memory = _hardware_plan({**LLAMA2, "remat": remat}, "2x2", {"fsdp": 4}, 4)
    assert memory.program == "maxtext"
    assert memory.fits is True
    assert abs(memory.total - LLAMA2_V5E4) / LLAMA2_V5E4 < 0.05


def test_llama3_on_v5e8_is_within_five_percent_of_maxtexts_compile():
    memory = _hardware_plan({**LLAMA3, "remat": "full"}, "2x4", {"fsdp": 8}, 8)
    assert abs(memory.total - LLAMA3_V5E8) / LLAMA3_V5E8 < 0.05


def test_maxtext_remat_none_is_priced_as_full_and_the_librarys_is_not():
    hw = hardware_memory(get_hardware("tpu-v5e"))
    priced = {
        (program, remat): memory_estimate(
            {**LLAMA2, "remat": remat}, {"fsdp": 4}, 4, program=program, **hw
        )
        for program in ("maxtext", "datarax")
        for remat in ("none", "full")
    }
    assert priced["maxtext", "none"].total == priced["maxtext", "full"].total
    assert priced["datarax", "none"].activations > 10 * priced["datarax", "full"].activations
    assert {p.program for p in priced.values()} == {"maxtext", "datarax"}


def test_the_scan_copies_are_each_devices_shard_of_the_mlp_kernels():
    ctx = mesh_context({**LLAMA2, "remat": "full"}, {"fsdp": 4}, 4)
    # gate, up and down of 32 layers, 4096 x 11008 each, bf16, split 4 ways:
    # copy.401-403 of XLA's live ranges, three bf16[32, 1024, 11008]
    assert maxtext_scan_copies(ctx, 2) == 3 * 32 * 1024 * 11008 * 2
    library = step_memory(ctx)
    maxtext = step_memory(ctx, program="maxtext")
    assert maxtext.temporaries > library.temporaries + 3 * 32 * 1024 * 11008 * 2 // 2
    pipelined = mesh_context(
        {**LLAMA2, "remat": "full"},
        {"stage": 2, "fsdp": 4},
        8,
    )
    assert maxtext_scan_copies(pipelined, 2) == 0  # not measured: not priced


# XLA's HBM allocation of MaxText's step for Mixtral cut to 4 layers on a v5e-8 (fsdp 8,
# one 2,048-token sequence a chip, bf16 weights, full remat), recorded
MIXTRAL_4L = {"name": "mixtral-8x7b", "layers": 4, "seq_len": 2048, "param_dtype": "bfloat16"}
MIXTRAL_V5E8 = {"sparse": 11_155_242_496, "dense": 12_402_533_376}


@pytest.mark.parametrize("kernel", ["sparse", "dense"])
def test_a_mixture_of_experts_holds_one_layers_experts_gathered_and_the_copies(kernel):
    model = {**MIXTRAL_4L, "remat": "full", "moe_kernel": kernel}
    if kernel == "dense":
        model["capacity_factor"] = 1.25
    # before: +15.1% (dropless: experts and their gradient gathered) and -28.8% (capacity)
    memory = _hardware_plan(model, "2x4", {"fsdp": 8}, 8)
    measured = MIXTRAL_V5E8[kernel]
    assert abs(memory.total - measured) / measured < 0.10
    ctx = mesh_context(model, {"fsdp": 8}, 8)
    # the expert kernels' shards of 4 layers: 3 x 4 x 8 x 4096 x 14336 bf16 over 8 devices
    experts = 3 * 4 * 8 * 4096 * 14336 * 2 // 8
    assert maxtext_scan_copies(ctx, 2) == experts


# XLA's HBM allocation of MaxText's pipelined step for Llama 2 7B on a v5e-8 (bf16 weights,
# full remat, GPipe, one 2,048-token sequence a chip), recorded
PIPELINED_V5E8 = {(2, 4): 15_446_603_776, (4, 2): 12_830_503_936}  # (stages, fsdp)


@pytest.mark.parametrize(("stages", "fsdp"), [(2, 4), (4, 2)])
def test_a_pipeline_stage_holds_its_layers_weights_gathered_over_fsdp(stages, fsdp):
    model = {**LLAMA2, "remat": "full"}
    options = ParallelOptions.from_json(pipeline={"microbatches": stages, "schedule": "gpipe"})
    ctx = mesh_context(model, {"stage": stages, "fsdp": fsdp}, 8, options=options)
    # a stage's 32 / stages layers, each attention (4 x 4096 x 4096) and MLP
    # (3 x 4096 x 11008) whole, bf16; the norms' scales (2 x 4096 a layer) too
    layer = 4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096
    assert maxtext_pipeline_gathered(ctx, 2) == 32 // stages * layer * 2
    # before: -41.2% (2 stages) and -26.2% (4 stages)
    memory = _hardware_plan(model, "2x4", {"stage": stages, "fsdp": fsdp}, 8, options)
    measured = PIPELINED_V5E8[stages, fsdp]
    assert abs(memory.total - measured) / measured < 0.05
    assert memory.total - step_memory(ctx).total >= maxtext_pipeline_gathered(ctx, 2)


# XLA's HBM allocation of MaxText's step for Llama 4 Scout on a v5p-128 (fsdp 64, one
# 8,192-token sequence a chip, float32 weights, full remat), recorded
LLAMA4_V5P128 = 42_896_131_872


def test_a_model_maxtext_scans_in_blocks_holds_a_blocks_experts_gathered():
    model = {"name": "llama4-17b-16e", "seq_len": 8192, "remat": "full"}
    assert maxtext_scan_block(model_spec(model)) == 4
    assert maxtext_scan_block(model_spec({"name": "mixtral-8x7b"})) == 1
    # Maverick's block of 4 has 2 MoE layers (experts every other layer)
    maverick = model_spec({"name": "llama4-17b-128e"})
    assert maxtext_scan_block(maverick) == 4 and maxtext_moe_layers_per_block(maverick) == 2
    layout = plan_hardware_devices("tpu-v5p", topology="4x4x4", ici={"fsdp": 64})
    memory = estimate_step("tpu-v5p", layout.axes_detail, model, 64).memory_per_device
    # before: -26.2% (one layer's experts gathered, where XLA holds four layers': twelve
    # bf16[1, 16, 5120, 8192]-sized buffers)
    assert abs(memory.total - LLAMA4_V5P128) / LLAMA4_V5P128 < 0.05
    ctx = mesh_context(model, {"fsdp": 64}, 64)
    four_layers = 4 * 3 * 16 * 5120 * 8192 * 2
    assert step_memory(ctx, program="maxtext").temporaries > four_layers
