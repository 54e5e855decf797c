"""Launchable or refused (DESIGN v1.4, "Every input is used or refused"): a launch MaxText's
configuration checks would refuse is ``not_launchable`` with MaxText's reason and what it
would accept (datarax.launch.maxtext_checks), and a DeepSeek-style model pipelines as
MaxText pipelines it (its leading dense layers before the pipeline).

``CASES`` are launches of real plans, each either written or refused here;
test_maxtext_accepts.py has MaxText's own checks judge every one of them.
"""

from __future__ import annotations

import pytest

from datarax.errors import PlanError
from datarax.launch.config import launch_config
from datarax.launch.maxtext import maxtext_args, parse_maxtext_args, plan_request_from_maxtext
from datarax.launch.maxtext_checks import (
    MAXTEXT_DEFAULTS,
    maxtext_refusal,
    per_device_batch_size,
)
from tests.datarax.launch.test_k8s import hardware_plan

TINY_MOE = {"kind": "transformer", "layers": 4, "d_model": 256, "d_ff": 512, "heads": 4,
            "kv_heads": 4, "head_dim": 64, "vocab": 1024, "seq_len": 256, "num_experts": 8,
            "experts_per_token": 2, "moe_d_ff": 256}  # fmt: skip
V5P_64 = {"hardware": "tpu-v5p", "topology": "4x4x4", "allow_split_physical_axes": True}
V5P_128 = {"hardware": "tpu-v5p", "topology": "4x4x8", "allow_split_physical_axes": True}
H100_9_HOSTS = {"hardware": "h100-sxm", "hosts": 9, "ici": {"stage": 1, "fsdp": 8},
                "dcn": {"stage": 9}}  # fmt: skip
LLAMA_405B = {"name": "llama3.1-405b", "remat": "full"}

# id -> (plan body, extra_args, None where the launch is written, else what the refusal
# quotes of MaxText)
CASES: dict[str, tuple[dict, list[str], str | None]] = {
    # the newcomer cases
    "microbatches-12-over-9-stages": (
        {**H100_9_HOSTS, "batch_shape": [96, 4096], "model": LLAMA_405B,
         "pipeline": {"microbatches": 12}},
        [], "must be divisible by the number of stages (9)"),
    "microbatches-9-over-9-stages": (
        {**H100_9_HOSTS, "batch_shape": [144, 4096], "model": LLAMA_405B,
         "pipeline": {"microbatches": 9}},
        [], None),
    "deepseek-v3-over-2-stages": (
        {**V5P_128, "ici": {"stage": 2, "fsdp": 8, "expert": 8}, "batch_shape": [256, 4096],
         "model": {"name": "deepseek3-671b"}},
        [], None),
    # MaxText's own default extent (-1) is the 58 MoE layers the launch writes
    "deepseek-v3-over-2-stages-maxtexts-defaults": (
        {**V5P_128, "ici": {"stage": 2, "fsdp": 8, "expert": 8}, "batch_shape": [256, 4096],
         "model": {"name": "deepseek3-671b"}},
        ["pipeline_parallel_layers=-1", "num_pipeline_repeats=-1"], None),
    "sparse-matmul-with-stage-and-expert": (
        {**V5P_64, "ici": {"stage": 4, "fsdp": 2, "expert": 8}, "batch_shape": [64, 4096],
         "model": {"name": "mixtral-8x7b", "moe_kernel": "sparse"},
         "pipeline": {"microbatches": 4}},
        [], None),
    # MaxText's other checks a plan's launch can meet
    "circular-pipeline-3-repeats": (
        {**H100_9_HOSTS, "batch_shape": [144, 4096], "model": LLAMA_405B,
         "pipeline": {"microbatches": 18, "layers_per_stage": 2, "schedule": "circular"}},
        [], None),
    "delayed-forwarding-needs-twice-the-stages": (
        {**H100_9_HOSTS, "batch_shape": [144, 4096], "model": LLAMA_405B,
         "pipeline": {"microbatches": 9}},
        ["pipeline_delay_activation_forwarding=true"], "at least 2 * num_stages microbatches"),
    "extra-args-microbatches-not-dividing-the-batch": (
        {**H100_9_HOSTS, "batch_shape": [144, 4096], "model": LLAMA_405B,
         "pipeline": {"microbatches": 9}},
        ["num_pipeline_microbatches=27"], "must be divisible by the number of microbatches"),
    "gemma2-odd-layers-per-stage": (
        {"hardware": "tpu-v5e", "topology": "2x4", "ici": {"stage": 2, "fsdp": 4},
         "batch_shape": [16, 4096], "model": {"name": "gemma2-9b"}},
        [], "must be equal to pipeline_parallel_layers"),
    "gemma2-over-3-stages": (
        {"hardware": "h100-sxm", "hosts": 3, "ici": {"stage": 1, "fsdp": 8},
         "dcn": {"stage": 3}, "batch_shape": [48, 4096], "model": {"name": "gemma2-9b"},
         "pipeline": {"layers_per_stage": 2, "microbatches": 6, "schedule": "circular"}},
        [], None),
    "batch-120-on-88-gpus": (
        {"hardware": "h100-sxm", "hosts": 11, "ici": {"context": 1, "fsdp": 8},
         "dcn": {"context": 11}, "batch_shape": [120, 3520], "model": {"name": "llama2-7b"}},
        [], None),
    "zero1-beside-fsdp": (
        {**V5P_64, "ici": {"data": 4, "fsdp": 16}, "batch_shape": [64, 4096],
         "model": {"name": "llama3.1-8b"}, "optimizer": {"name": "adamw", "shard_over_data": True}},
        [], "cannot be combined with FSDP"),
    "zero1-over-data": (
        {**V5P_64, "ici": {"data": 16, "tensor": 4}, "batch_shape": [64, 4096],
         "model": {"name": "llama3.1-8b"}, "optimizer": {"name": "adamw", "shard_over_data": True}},
        [], None),
    "ring-on-tpu": (
        {**V5P_64, "ici": {"fsdp": 16, "context": 4}, "batch_shape": [16, 8192],
         "model": {"name": "llama3.1-8b"}, "context_parallel": {"strategy": "ring"}},
        [], None),
    "ring-on-tpu-with-dot-attention": (
        {**V5P_64, "ici": {"fsdp": 16, "context": 4}, "batch_shape": [16, 8192],
         "model": {"name": "llama3.1-8b", "attention": "dot"},
         "context_parallel": {"strategy": "ring"}},
        [], "requires attention=flash"),
    "ring-with-mla-packs": (
        {**V5P_128, "ici": {"fsdp": 16, "context": 8}, "batch_shape": [16, 8192],
         "model": {"name": "deepseek3-671b"}, "context_parallel": {"strategy": "ring"}},
        [], "with MLA does not support packing"),
    "ring-with-mla-unpacked": (
        {**V5P_128, "ici": {"fsdp": 16, "context": 8}, "batch_shape": [16, 8192],
         "model": {"name": "deepseek3-671b"}, "context_parallel": {"strategy": "ring"}},
        ["packing=false"], None),
    "vocab-tiles-not-dividing-the-tokens": (
        {"hardware": "tpu-v5e", "topology": "2x4", "ici": {"fsdp": 4, "tensor": 2},
         "batch_shape": [4, 256], "model": {**TINY_MOE, "d_ff": 256, "vocab_tiling": 256}},
        [], "divisible by the number of vocab tiles"),
    "batch-share-floats-cannot-hold": (
        {"hardware": "h100-sxm", "hosts": 11, "ici": {"context": 1, "fsdp": 8},
         "dcn": {"context": 11}, "batch_shape": [120, 2816], "model": {"name": "llama2-7b"}},
        [], "divisible by the number of vocab tiles"),
    "fully-moe-with-a-wider-dense-mlp": (
        {"hardware": "tpu-v5e", "topology": "2x4", "ici": {"fsdp": 8}, "batch_shape": [8, 256],
         "model": TINY_MOE},
        [], None),  # MaxText's mixtral block: base_mlp_dim is written as the experts' width
    "fully-moe": (
        {"hardware": "tpu-v5e", "topology": "2x4", "ici": {"fsdp": 8}, "batch_shape": [8, 256],
         "model": {**TINY_MOE, "d_ff": 256}},
        [], None),
    "llama4-with-a-capacity": (
        {**V5P_64, "ici": {"fsdp": 16, "expert": 4}, "batch_shape": [64, 4096],
         "model": {"name": "llama4-17b-16e", "capacity_factor": 1.25}},
        [], "capacity_factor >= 0"),
    "gpt-oss-dense-kernel-with-a-capacity": (
        {**V5P_64, "ici": {"fsdp": 16, "expert": 4}, "batch_shape": [64, 4096],
         "model": {"name": "gpt-oss-120b", "capacity_factor": 1.25, "moe_kernel": "dense"}},
        [], "only supports dropless"),
    "dcn-on-one-slice": (
        {"hardware": "tpu-v5e", "topology": "2x4", "ici": {"fsdp": 8}, "batch_shape": [8, 2048],
         "model": {"name": "llama2-7b"}},
        ["dcn_data_parallelism=2"], "only one slice available"),
    "gpu-flash-without-max-segments": (
        {"hardware": "h100-sxm", "hosts": 2, "ici": {"fsdp": 8}, "dcn": {"fsdp": 2},
         "batch_shape": [16, 4096], "model": {"name": "llama2-7b"}},
        ["max_segments_per_seq=-1"], "max_segments_per_seq must be set"),
    "named-model-key-changed-without-override": (
        {"hardware": "tpu-v5e", "topology": "2x4", "ici": {"fsdp": 8}, "batch_shape": [8, 2048],
         "model": {"name": "llama2-7b"}},
        ["base_mlp_dim=4096"], "overridden by both model config"),
}  # fmt: skip


def launch_args(body: dict, extra: list[str]) -> tuple[list[str], int, int]:
    """``(args, devices, slices)``: what a ``maxtext`` launch of ``body`` with ``extra``
    writes, whether or not it is refused (extra args replace the generated ones)."""
    plan = hardware_plan(body)
    keys = {arg.split("=", 1)[0] for arg in extra}
    args = [a for a in maxtext_args(plan)["args"] if a.split("=", 1)[0] not in keys] + extra
    return args, int(plan["total_devices"]), int(plan.get("slices") or 1)


@pytest.mark.parametrize(("body", "extra", "refused"), CASES.values(), ids=CASES.keys())
def test_launch_is_written_or_refused_as_maxtext_would(body, extra, refused):
    plan = hardware_plan(body)
    if refused is None:
        config = launch_config(plan, "maxtext", extra_args=extra)
        assert config["args"][-len(extra) :] == extra if extra else config["args"]
        return
    with pytest.raises(PlanError) as error:
        launch_config(plan, "maxtext", extra_args=extra)
    assert error.value.code == "not_launchable"
    assert refused in error.value.message and "accepted:" in error.value.message
    assert error.value.message.startswith("MaxText 0.2.5 would refuse this launch: ")
    # every target that runs MaxText's trainer refuses it; a command of one's own does not
    with pytest.raises(PlanError):
        launch_config(plan, "jobset", extra_args=extra, image="img:1")
    launch_config(plan, "jobset", extra_args=extra, image="img:1", command=["./run.sh"])


def test_microbatches_not_a_multiple_of_the_stages_say_what_is_accepted():
    body, extra, _ = CASES["microbatches-12-over-9-stages"]
    args, devices, _ = launch_args(body, extra)
    reason = maxtext_refusal(args, devices=devices)
    assert reason is not None and "a multiple of the 9 stages (9, 18, 27 ...)" in reason
    assert "the 96 sequences now are no multiple of 9" in reason
    # with a batch they divide, the accepted microbatches are listed
    args = [a if not a.startswith("per_device") else "per_device_batch_size=2" for a in args]
    reason = maxtext_refusal(args, devices=devices)
    assert reason is not None and "divides the 144 sequences of a forward pass: 9, 18, 36," in (
        reason
    )


def test_deepseek_v3_pipelines_its_moe_layers_over_2_stages():
    # issue 56: "2 stages do not divide the model's 61 layers" though its 58 MoE layers do
    body, _, _ = CASES["deepseek-v3-over-2-stages"]
    plan = hardware_plan(body)
    pipeline = plan["step_estimate"]["pipeline"]
    assert (pipeline["stages"], pipeline["layers_per_stage"], pipeline["repeats"]) == (2, 29, 1)
    assert pipeline["bubble_fraction"] == pytest.approx(1 / 3)  # 2 microbatches: the stages
    args = parse_maxtext_args(launch_config(plan, "maxtext")["args"])
    assert args["pipeline_parallel_layers"] == 58 and args["num_layers_per_pipeline_stage"] == 29
    assert args["num_pipeline_repeats"] == 1 and args["first_num_dense_layers"] == 3
    # stages that divide 61 but not the 58 pipelined layers are refused, saying which
    with pytest.raises(PlanError) as error:
        hardware_plan({**body, "ici": {"stage": 4, "fsdp": 4, "expert": 8}})
    assert error.value.code == "invalid_parallelism"
    assert "the model's 58 pipelined layers (its 3 leading dense layers" in error.value.message
    assert "[2, 29, 58]" in error.value.message


def test_a_dense_models_pipeline_spans_every_layer():
    body, _, _ = CASES["circular-pipeline-3-repeats"]
    args = parse_maxtext_args(launch_config(hardware_plan(body), "maxtext")["args"])
    assert args["pipeline_parallel_layers"] == 126 and args["num_pipeline_repeats"] == 7
    assert args["num_layers_per_pipeline_stage"] == 2 and args["num_pipeline_microbatches"] == 18


def test_gemma2_pipelines_in_maxtexts_layer_pairs():
    body, _, _ = CASES["gemma2-over-3-stages"]
    args = parse_maxtext_args(launch_config(hardware_plan(body), "maxtext")["args"])
    # 42 layers are MaxText's 21 decoder layers: 14 of ours a stage, 2 a pass, 7 passes
    assert args["pipeline_parallel_layers"] == 21 and args["num_layers_per_pipeline_stage"] == 1
    assert args["num_pipeline_repeats"] == 7
    # over 2 stages no pass holds whole pairs: 21 a stage, odd
    body, _, _ = CASES["gemma2-odd-layers-per-stage"]
    args, devices, _ = launch_args(body, [])
    reason = maxtext_refusal(args, devices=devices)
    assert reason is not None and "each a pair of the plan's 42 layers" in reason
    assert "accepted: a stage count dividing 21: among [3, 7, 21]" in reason


def test_ring_on_tpu_runs_tokamax_splash_and_gpu_flash_bounds_segments():
    body, _, _ = CASES["ring-on-tpu"]
    args = parse_maxtext_args(launch_config(hardware_plan(body), "maxtext")["args"])
    assert args["use_tokamax_splash"] is True and args["context_parallel_strategy"] == "ring"
    body, _, _ = CASES["gpu-flash-without-max-segments"]
    args = parse_maxtext_args(launch_config(hardware_plan(body), "maxtext")["args"])
    assert args["attention"] == "cudnn_flash_te" and args["max_segments_per_seq"] == 32


def test_per_device_batch_size_gives_maxtext_the_plans_global_batch():
    # MaxText trains int(devices * per_device_batch_size) sequences: 88 * (120 / 88) is
    # 119.99999999999999, so 120 / 88 would train 119
    body, _, _ = CASES["batch-120-on-88-gpus"]
    args = parse_maxtext_args(launch_config(hardware_plan(body), "maxtext")["args"])
    assert int(88 * (120 / 88)) == 119 and int(88 * args["per_device_batch_size"]) == 120


def test_a_batch_share_maxtexts_floats_cannot_hold_says_which_batches_would():
    # 120 sequences of 2816 tokens over 88 GPUs: no float x has int(88 x) == 120 and
    # x * 2816 whole, which MaxText's vocab-tiling check needs even with one tile
    body, _, _ = CASES["batch-share-floats-cannot-hold"]
    args, devices, _ = launch_args(body, [])
    reason = maxtext_refusal(args, devices=devices)
    assert reason is not None and "MaxText's floats hold exactly, e.g. " in reason
    batches = [int(b) for b in reason.rsplit("e.g. ", 1)[1].split(", ")]
    assert batches and all(abs(b - 120) < 88 for b in batches)
    for batch in batches:
        x = per_device_batch_size(batch, 88, 2816, 1)
        assert int(88 * x) == batch and (x * 2816) % 1 == 0


def test_defaults_are_maxtexts():
    # base.yml's values the checks assume where a launch writes none
    assert MAXTEXT_DEFAULTS["num_pipeline_microbatches"] == -1
    assert MAXTEXT_DEFAULTS["ici_fsdp_parallelism"] == -1
    assert MAXTEXT_DEFAULTS["dcn_data_parallelism"] == -1
    assert MAXTEXT_DEFAULTS["packing"] is True and MAXTEXT_DEFAULTS["use_tokamax_splash"] is False


def test_maxtexts_pipeline_extent_keys_read_back_or_are_refused():
    body, _, _ = CASES["deepseek-v3-over-2-stages"]
    plan = hardware_plan(body)
    parsed = parse_maxtext_args(launch_config(plan, "maxtext")["args"])
    again = plan_request_from_maxtext(parsed, hardware="tpu-v5p", topology="4x4x8")
    assert again["pipeline"]["layers_per_stage"] == 29
    first, second = plan["step_estimate"]["pipeline"], hardware_plan(again)["step_estimate"]
    # MaxText's schedule is circular: one pass round the stages is GPipe's
    assert {**second["pipeline"], "schedule": "gpipe"} == first
    for key, value, says in (("pipeline_parallel_layers", 56, "is 58"),
                             ("num_pipeline_repeats", 2, "is 1")):  # fmt: skip
        with pytest.raises(PlanError) as error:
            plan_request_from_maxtext({**parsed, key: value}, hardware="tpu-v5p", topology="4x4x8")
        assert error.value.code == "invalid_maxtext_config" and says in error.value.message


def test_a_custom_mixture_of_experts_gets_a_moe_block_or_is_refused():
    # without a decoder_block, base.yml's llama2 block would build the model dense
    body = {"hardware": "tpu-v5e", "topology": "2x4", "ici": {"fsdp": 8},
            "batch_shape": [8, 256], "model": TINY_MOE}  # fmt: skip
    parsed = parse_maxtext_args(maxtext_args(hardware_plan(body))["args"])
    assert parsed["decoder_block"] == "mixtral" and parsed["num_experts"] == 8
    assert parsed["base_mlp_dim"] == parsed["base_moe_mlp_dim"] == 256
    for extra in ({"shared_experts": 1}, {"first_dense_layers": 1}, {"moe_every": 2}):
        plan = hardware_plan({**body, "model": {**TINY_MOE, **extra}})
        out = maxtext_args(plan)
        assert "would build the model dense" in out["refusal"]
        assert "decoder_block" not in parse_maxtext_args(out["args"])
        for target in ("maxtext", "jobset"):  # both run MaxText's trainer
            with pytest.raises(PlanError) as error:
                launch_config(plan, target)
            assert error.value.code == "not_launchable"
            assert "Accepted: a named model" in str(error.value)
        # a JobSet running the user's own command does not run MaxText: written
        assert launch_config(plan, "jobset", command=["python", "train.py"])["manifest"]
