"""``POST /v1/meshes`` bodies: plain plans, hardware plans and MaxText keys, each refusing
the other's fields; fields shared with hardware plans keep their bounds."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from app.schemas.hardware import HardwarePlanRequest, TransformerModel
from app.schemas.meshes import (
    MAX_MAXTEXT_TEXT,
    MAX_PLAN_DEVICES,
    PLAN_REQUEST_EXAMPLE,
    MeshPlanRequest,
    MlpModel,
    PlanModel,
)

HARDWARE = {"hardware": "tpu-v5e", "topology": "4x4", "ici": {"data": -1}}


def test_the_example_is_a_plain_plan_with_an_mlp():
    body = MeshPlanRequest.model_validate(PLAN_REQUEST_EXAMPLE)
    assert body.axes == {"data": -1, "model": 4} and isinstance(body.model, MlpModel)


def test_the_plan_model_union_takes_an_mlp_or_a_transformer():
    model = TypeAdapter(PlanModel).validate_python(
        {"kind": "transformer", "layers": 1, "d_model": 8, "d_ff": 8, "heads": 1,
         "kv_heads": 1, "vocab": 8, "seq_len": 8}
    )  # fmt: skip
    assert isinstance(model, TransformerModel)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "axes is required"),
        ({"axes": {"data": 2}, "ici": {"data": 2}}, "ici need hardware"),
        ({**HARDWARE, "num_devices": 4}, "do not apply to a hardware plan"),
        ({"hardware": "tpu-v5e"}, "needs ici"),
        ({"maxtext": {"ici_fsdp_parallelism": -1}}, "maxtext needs hardware"),
        ({**HARDWARE, "maxtext": {"model_name": "x"}}, "do not go beside maxtext"),
        ({"axes": {"data": 2}, "num_devices": MAX_PLAN_DEVICES + 1}, "less than or equal"),
    ],
    ids=["no-axes", "ici-alone", "mixed", "no-ici", "maxtext-alone", "maxtext-and-ici", "big"],
)
def test_plain_and_hardware_fields_do_not_mix(body, message):
    with pytest.raises(ValidationError, match=message):
        MeshPlanRequest.model_validate(body)


def test_maxtext_strings_are_bounded():
    body = {"hardware": "tpu-v5e", "topology": "4x4"}
    assert MeshPlanRequest.model_validate({**body, "maxtext": {"model_name": "x"}}).maxtext
    with pytest.raises(ValidationError, match=f"at most {MAX_MAXTEXT_TEXT}"):
        MeshPlanRequest.model_validate(
            {**body, "maxtext": {"model_name": "x" * (MAX_MAXTEXT_TEXT + 1)}}
        )


def test_shared_hardware_fields_keep_the_hardware_plans_bounds_and_docs():
    ours, theirs = MeshPlanRequest.model_fields, HardwarePlanRequest.model_fields
    for name in ("topology", "slices", "hosts", "dcn", "allow_split_physical_axes"):
        assert ours[name].default == theirs[name].default, name
        assert ours[name].description == theirs[name].description, name
    with pytest.raises(ValidationError):
        MeshPlanRequest.model_validate({**HARDWARE, "slices": 0})
