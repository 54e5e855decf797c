"""Sequence parallelism (Megatron's; MaxText's ``tensor_sequence``) as a kind of its own:
the registry entry and its terms price it, the weights split as tensor splits them, the
residual stream along the sequence, and a reduce-scatter and an all-gather take the place
of each of tensor's all-reduces. (MaxText's ``ici_tensor_sequence_parallelism`` both ways:
tests/datarax/launch/test_maxtext.py's round trips.)"""

from __future__ import annotations

import pytest

from datarax.errors import PlanError
from datarax.estimate.cost import estimate_step
from datarax.estimate.memory import memory_estimate
from datarax.hardware.topology import plan_hardware_devices
from datarax.parallel.context import mesh_context

LLAMA_8B = {"name": "llama3.1-8b", "remat": "full"}
SMALL = {"kind": "transformer", "d_model": 256, "heads": 8, "kv_heads": 8, "layers": 2,
         "d_ff": 1024, "vocab": 1024, "seq_len": 512}  # fmt: skip


def _estimate(ici, batch=64, model=LLAMA_8B):
    layout = plan_hardware_devices("tpu-v5p", ici=ici, topology="4x4x4")
    return layout, estimate_step(layout.hardware, layout.axes_detail, model, batch)


def _activations(est, axis):
    return {
        (c.kind, c.phase): (c.count, c.bytes_per_device)
        for c in est.collectives
        if c.axis == axis and c.what == "activations"
    }


def test_a_sequence_axis_moves_tensors_bytes_as_reduce_scatter_and_all_gather():
    _, tensor = _estimate({"fsdp": 16, "tensor": 4})
    _, sequence = _estimate({"fsdp": 16, "sequence": 4})
    reduced = _activations(tensor, "tensor")
    split = _activations(sequence, "sequence")
    assert {kind for kind, _ in reduced} == {"all-reduce"}
    assert {kind for kind, _ in split} == {"reduce-scatter", "all-gather"}
    for phase in ("forward", "backward"):
        count, volume = reduced[("all-reduce", phase)]
        # one reduce-scatter and one all-gather per all-reduce, each of the same array
        assert split[("reduce-scatter", phase)] == (count, volume)
        assert split[("all-gather", phase)] == (count, volume)
    # on the wire: an all-reduce is a reduce-scatter then an all-gather
    sequence_s = sum(c.seconds for c in sequence.collectives if c.axis == "sequence")
    tensor_s = sum(c.seconds for c in tensor.collectives if c.axis == "tensor")
    assert sequence_s == pytest.approx(tensor_s, rel=1e-6)


def test_a_sequence_axis_splits_the_weights_activations_and_work_as_tensor_does():
    _, tensor = _estimate({"fsdp": 16, "tensor": 4})
    _, sequence = _estimate({"fsdp": 16, "sequence": 4})
    mem_t, mem_s = tensor.memory_per_device, sequence.memory_per_device
    assert mem_s.params == mem_t.params and mem_s.activations == mem_t.activations
    assert sequence.breakdown["matmul_s"] == pytest.approx(tensor.breakdown["matmul_s"])
    # the MLP's kernels split their width over the sequence axis, as over tensor
    shards = {g.path: (spec, shard) for g, spec, shard, _ in sequence.param_shardings}
    spec, shard = shards["layers/*/mlp/gate"]
    assert "sequence" in spec and shard[-1] == 14336 // 4


def test_sequence_beside_tensor_divides_the_stream_both_split():
    ctx = mesh_context(SMALL, {"data": 2, "tensor": 2, "sequence": 2}, global_batch=4)
    assert (ctx.width_shards, ctx.activation_sequence_shards, ctx.compute_shards) == (4, 2, 4)
    assert ctx.axes_where(lambda kind: kind.splits_width) == ("tensor", "sequence")
    moved = {
        (axis, t.op): t.bytes_per_device for axis, t in ctx.traffic() if t.what == "activations"
    }
    # the tensor axis all-reduces the stream already split along the sequence
    assert moved[("tensor", "all-reduce")] * 2 == moved[("sequence", "reduce-scatter")]


@pytest.mark.parametrize(
    ("model", "axes", "says"),
    [
        ({"kind": "mlp", "features": [64, 256, 64]}, {"data": 2, "sequence": 4},
         "need a transformer"),
        ({**SMALL, "seq_len": 500}, {"data": 2, "sequence": 8}, "sequence axes (8)"),
        ({**SMALL, "heads": 6, "kv_heads": 6, "d_model": 384}, {"tensor": 2, "sequence": 2},
         "tensor=4"),
    ],
    ids=["mlp", "sequence-not-divided", "heads-over-tensor-x-sequence"],
)  # fmt: skip
def test_a_sequence_axis_that_does_not_apply_is_refused(model, axes, says):
    with pytest.raises(PlanError) as caught:
        memory_estimate(model, axes, 8)
    assert caught.value.code in ("invalid_parallelism", "tensor_not_divisible")
    assert says in caught.value.message
