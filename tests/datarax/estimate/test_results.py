"""The estimates' records: frozen, typed, read as mappings, serialised once."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from datarax.estimate.cost import estimate_step
from datarax.estimate.memory import memory_estimate
from datarax.estimate.results import Collective, MemoryEstimate, StepEstimate
from datarax.hardware.topology import plan_hardware_devices

MODEL = {"kind": "transformer", "layers": 2, "d_model": 512, "d_ff": 2048, "heads": 8,
         "kv_heads": 8, "vocab": 32000, "seq_len": 1024}  # fmt: skip


@pytest.fixture(scope="module")
def estimate() -> StepEstimate:
    layout = plan_hardware_devices("tpu-v5e", topology="4x4", ici={"fsdp": 4, "tensor": 4})
    return estimate_step("tpu-v5e", layout.axes_detail, MODEL, 16)


def test_the_estimate_is_a_frozen_record(estimate):
    assert isinstance(estimate, StepEstimate)
    assert isinstance(estimate.memory_per_device, MemoryEstimate)
    assert estimate.collectives and all(isinstance(c, Collective) for c in estimate.collectives)
    with pytest.raises(dataclasses.FrozenInstanceError):
        estimate.step_s = 0.0  # type: ignore[misc]


def test_records_read_as_the_dicts_they_replace(estimate):
    assert estimate["step_s"] == estimate.step_s
    assert list(estimate) == [f.name for f in dataclasses.fields(estimate)]
    memory = estimate["memory_per_device"]
    assert dict(memory) == {f.name: getattr(memory, f.name) for f in dataclasses.fields(memory)}
    assert memory == dict(memory)  # equal to a dict of the same items, as before
    with pytest.raises(KeyError):
        estimate["missing"]


def test_to_json_is_the_answer_without_internal_fields(estimate):
    doc = estimate.to_json()
    assert not {"memory_per_device", "predicted_components", "param_shardings"} & set(doc)
    assert list(doc)[:7] == ["flops", "compute_s", "comm_s", "step_s", "mfu", "bottleneck",
                             "collectives"]  # fmt: skip
    assert doc["collectives"][0] == dict(estimate.collectives[0])
    assert json.loads(json.dumps(doc)) == doc  # plain JSON all the way down


def test_memory_estimate_alone():
    mem = memory_estimate(MODEL, {"fsdp": 8}, 16, hbm_bytes=16 * 2**30)
    assert mem.total == mem.params + mem.grads + mem.optimizer + mem.activations + mem.batch + (
        mem.temporaries
    )
    assert mem.fits is True and mem.to_json()["fits"] is True


def test_param_specs_are_worked_out_once_and_carried(estimate):
    groups = [group.path for group, *_ in estimate.param_shardings]
    assert groups and len(groups) == len(set(groups))
    # the memory's parameter bytes are those shards'
    assert estimate.memory_per_device.params == sum(
        math.prod(shard) * group.repeat * 2 for group, _, shard, _ in estimate.param_shardings
    )
