"""The estimates' results: frozen, typed answers read as mappings of their JSON members,
serialised once; the library's internal fields left out."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from datarax.answers import estimates as answers
from datarax.answers.estimates import RooflinePhases, StepBreakdown
from datarax.estimate.cost import estimate_step
from datarax.estimate.memory import memory_estimate
from datarax.estimate.results import Collective, MemoryEstimate, StepEstimate
from datarax.hardware.topology import plan_hardware_devices
from datarax.parallel.options import ParallelOptions, Pipeline, PipelineShape

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


INTERNAL = ("memory_per_device", "predicted_components", "param_shardings")


def test_records_read_as_the_dicts_they_replace(estimate):
    assert estimate["step_s"] == estimate.step_s
    # the mapping holds the answer's members: every field but the internal ones
    assert list(estimate) == [
        f.name for f in dataclasses.fields(estimate) if f.name not in INTERNAL
    ]
    assert list(estimate) == list(estimate.to_json())
    memory = estimate.memory_per_device
    assert dict(memory) == {f.name: getattr(memory, f.name) for f in dataclasses.fields(memory)}
    assert memory == dict(memory)  # equal to a dict of the same items, as before
    for name in ("missing", *INTERNAL):
        assert name not in estimate
        with pytest.raises(KeyError):
            estimate[name]


def test_the_estimate_is_the_answer_with_its_internals(estimate):
    assert isinstance(estimate, answers.StepEstimate)
    assert isinstance(estimate.phases, RooflinePhases) and estimate.phases.forward.compute_s > 0
    assert isinstance(estimate.breakdown, StepBreakdown) and estimate.breakdown.bubble_s == 0
    # parsed back from its JSON: the same answer, less the internal fields
    parsed = answers.StepEstimate.from_json(estimate.to_json())
    assert parsed.to_json() == estimate.to_json() and parsed == estimate
    assert all(isinstance(c, Collective) for c in parsed.collectives)


def test_a_pipelined_estimate_holds_its_pipeline_shape():
    layout = plan_hardware_devices("tpu-v5e", topology="4x4", ici={"stage": 4, "fsdp": 4})
    options = ParallelOptions(pipeline=Pipeline(microbatches=2))
    est = estimate_step("tpu-v5e", layout.axes_detail, {**MODEL, "layers": 4}, 16, options=options)
    assert isinstance(est.pipeline, PipelineShape) and est.pipeline.in_flight > 0
    assert est.to_json()["pipeline"] == {
        "stages": 4, "microbatches": 2, "repeats": 1, "layers_per_stage": 1,
        "schedule": "gpipe", "bubble_fraction": 3 / 5,
    }  # fmt: skip


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
