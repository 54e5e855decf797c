"""Pipeline stages, context parallelism and ZeRO-1 in the step estimates (issue 38):
each stage holds its layers and pays its bubble, a context axis divides the tokens and
moves keys and values, ZeRO-1 splits the optimizer state over the data axes."""

from __future__ import annotations

import pytest

from datarax.errors import PlanError
from datarax.estimate.cost import estimate_step
from datarax.hardware.topology import plan_hardware_devices
from datarax.parallel.options import ParallelOptions

LLAMA_70B = {"name": "llama3.1-70b", "remat": "full"}


def _estimate(hardware, ici, dcn, model, batch, options=None, **where):
    layout = plan_hardware_devices(hardware, ici=ici, dcn=dcn, **where)
    return estimate_step(layout.hardware, layout.axes_detail, model, batch, options=options)


def _h100(ici, dcn, batch, options=None, model=LLAMA_70B):
    return _estimate("h100-sxm", ici, dcn, model, batch, options, hosts=64)


def test_stages_hold_their_layers_and_pay_the_bubble():
    flat = _h100({"stage": 1, "fsdp": 8}, {"stage": 1, "fsdp": 64}, 512)
    staged = _h100({"stage": 1, "fsdp": 8}, {"stage": 8, "fsdp": 8}, 512)
    # 8 stages x 64 fsdp hold the layers as 512 fsdp do; the embedding and head (two
    # 128256 x 8192 bfloat16 tables) are whole on every stage: 64 ways, not 512
    tables = 2 * 128256 * 8192 * 2
    assert staged.memory_per_device.params == pytest.approx(
        flat.memory_per_device.params + tables * (1 / 64 - 1 / 512), rel=1e-6
    )
    assert staged.pipeline == {"stages": 8, "microbatches": 8, "repeats": 1,
                               "layers_per_stage": 10, "schedule": "gpipe",
                               "bubble_fraction": pytest.approx(7 / 15)}  # fmt: skip
    bubble = staged.breakdown["bubble_s"]
    work = staged.step_s - bubble - staged.breakdown["exposed_comm_s"]
    assert bubble == pytest.approx(work * (7 / 15) / (1 - 7 / 15), rel=0.01)
    assert flat.breakdown["bubble_s"] == 0 and flat.pipeline is None
    # the embedding's gradients are all-reduced over the stages, the layers' are not
    grads = {c.what for c in staged.collectives if c.axis == "stage" and c.kind == "all-reduce"}
    assert grads == {"grads"}


def test_more_microbatches_shrink_the_bubble_and_1f1b_the_activations():
    ici, dcn = {"stage": 1, "fsdp": 8}, {"stage": 8, "fsdp": 8}

    def run(**pipeline):
        return _h100(ici, dcn, 2048, ParallelOptions.from_json(pipeline))

    gpipe_8, gpipe_32 = run(microbatches=8), run(microbatches=32)
    one_f1b = run(microbatches=32, schedule="1f1b")
    assert gpipe_32.breakdown["bubble_s"] < gpipe_8.breakdown["bubble_s"]
    assert one_f1b.pipeline["bubble_fraction"] == gpipe_32.pipeline["bubble_fraction"]
    # 1F1B keeps 8 of the 32 microbatches in flight, GPipe all of them
    act_gpipe = gpipe_32.memory_per_device.activations
    act_1f1b = one_f1b.memory_per_device.activations
    assert act_1f1b < 0.5 * act_gpipe
    sends = {(c.phase, c.count) for c in one_f1b.collectives if c.kind == "send-recv"}
    assert sends == {("forward", 32), ("backward", 32)}


def test_stages_must_divide_the_layers():
    with pytest.raises(PlanError) as caught:
        _h100({"stage": 1, "fsdp": 8}, {"stage": 8, "fsdp": 8}, 512,
              model={"name": "llama3.1-405b"})  # fmt: skip
    assert caught.value.code == "invalid_parallelism" and "126 layers" in caught.value.message


LONG = {"name": "llama3.1-70b", "seq_len": 131072, "remat": "full"}


def _v5p(ici, batch, options=None, model=LONG):
    return _estimate("tpu-v5p", ici, {}, model, batch, options, topology="4x4x4")


def test_a_context_axis_divides_the_tokens_and_gathers_keys_and_values():
    flat = _v5p({"fsdp": 64}, 64)
    context = _v5p({"fsdp": 16, "context": 4}, 16)
    # one sequence a device on fsdp; a quarter of one on context
    assert 4 * context.tokens_per_device == flat.tokens_per_device == 131072
    assert context.memory_per_device.activations == pytest.approx(
        flat.memory_per_device.activations / 4, rel=0.01
    )
    # the keys and values of the whole sequence, gathered, and their gradients
    kv = 2 * 131072 * 8 * (128 + 128) * 2
    assert context.memory_per_device.temporaries >= kv
    kv = {(c.kind, c.phase) for c in context.collectives if c.what == "keys and values"}
    assert kv == {("all-gather", "forward"), ("reduce-scatter", "backward"),
                  ("all-gather", "backward")}  # fmt: skip
    ring = _v5p(
        {"fsdp": 16, "context": 4}, 16, ParallelOptions.from_json(None, {"strategy": "ring"})
    )
    assert {c.kind for c in ring.collectives if c.what == "keys and values"} == {"send-recv"}
    # the ring's passes hide behind the attention they feed
    assert ring.breakdown["exposed_comm_s"] <= context.breakdown["exposed_comm_s"]


def test_without_load_balance_the_last_shard_sets_the_pace():
    balanced = _v5p({"fsdp": 16, "context": 4}, 16)
    skewed = _v5p({"fsdp": 16, "context": 4}, 16,
                  ParallelOptions.from_json(None, {"load_balance": False}))  # fmt: skip
    ratio = skewed.breakdown["attention_s"] / balanced.breakdown["attention_s"]
    assert ratio == pytest.approx(7 / 4)  # (2 * 4 - 1) / 4


def test_a_context_axis_must_divide_the_sequence():
    with pytest.raises(PlanError) as caught:
        _v5p({"fsdp": 16, "context": 4}, 16, model={**LONG, "seq_len": 131068})
    assert caught.value.code == "invalid_parallelism" and "seq_len 131068" in caught.value.message


def test_zero1_splits_the_optimizer_state_over_data():
    model = {"name": "llama3.1-8b", "remat": "full"}
    ici = {"data": 4, "fsdp": 16}
    plain = _estimate("tpu-v5p", ici, {}, model, 64, topology="4x4x4")
    zero1 = _estimate("tpu-v5p", ici, {}, model, 64, ParallelOptions(shard_over_data=True),
                      topology="4x4x4")  # fmt: skip
    assert zero1.memory_per_device.optimizer * 4 == pytest.approx(
        plain.memory_per_device.optimizer, rel=1e-6
    )
    assert zero1.memory_per_device.params == plain.memory_per_device.params
    plain_ops = {(c.kind, c.what) for c in plain.collectives if c.axis == "data"}
    zero1_ops = {(c.kind, c.what) for c in zero1.collectives if c.axis == "data"}
    assert plain_ops == {("all-reduce", "grads")}
    assert zero1_ops == {("reduce-scatter", "grads"), ("all-gather", "params")}
