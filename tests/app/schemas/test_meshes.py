"""``POST /v1/meshes`` bodies: one type per mode (live, abstract, hardware, MaxText) told
apart by the members sent, each refusing the others' members; fields shared with hardware
plans keep their bounds."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from app.schemas.hardware import HardwarePlanRequest, TransformerModel
from app.schemas.meshes import (
    MAX_MAXTEXT_TEXT,
    MAX_PLAN_DEVICES,
    PLAN_REQUEST_EXAMPLE,
    AbstractPlanBody,
    HardwarePlanBody,
    LivePlanBody,
    MaxTextPlanBody,
    MeshPlanRequest,
    MlpModel,
    PlanModel,
    plan_mode,
)

HARDWARE = {"hardware": "tpu-v5e", "topology": "4x4", "ici": {"data": -1}}


def test_the_example_is_a_plain_plan_with_an_mlp():
    body = MeshPlanRequest.model_validate(PLAN_REQUEST_EXAMPLE).root
    assert isinstance(body, LivePlanBody)
    assert body.axes == {"data": -1, "model": 4} and isinstance(body.model, MlpModel)


@pytest.mark.parametrize(
    ("body", "mode"),
    [
        ({"axes": {"data": 2}}, LivePlanBody),
        ({"axes": {"data": 2}, "num_devices": None, "hardware": None, "slices": 1}, LivePlanBody),
        ({"axes": {"data": 2}, "num_devices": 2}, AbstractPlanBody),
        (HARDWARE, HardwarePlanBody),
        ({**HARDWARE, "axes": None, "maxtext": None}, HardwarePlanBody),
        ({"hardware": "tpu-v5e", "topology": "4x4", "maxtext": {}}, MaxTextPlanBody),
    ],
    ids=["live", "live-nulls-and-defaults", "abstract", "hardware", "hardware-nulls", "maxtext"],
)
def test_a_body_is_parsed_once_into_its_modes_type(body, mode):
    parsed = MeshPlanRequest.model_validate(body).root
    assert type(parsed) is mode
    assert plan_mode(body) == plan_mode(parsed)  # a parsed body keeps its mode


def test_errors_name_the_member_not_the_mode():
    with pytest.raises(ValidationError) as info:
        MeshPlanRequest.model_validate({"axes": {"data": "x"}})
    assert [e["loc"] for e in info.value.errors()] == [("axes", "data")]
    with pytest.raises(ValidationError) as info:
        MeshPlanRequest.model_validate({**HARDWARE, "slices": 0, "extra": 1})
    assert [e["loc"] for e in info.value.errors()] == [("slices",), ("extra",)]
    with pytest.raises(ValidationError, match="valid dictionary"):
        MeshPlanRequest.model_validate([1])


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
        ({"axes": {"data": 2}, "model": {"name": "llama2-7b"}}, "needs a hardware plan"),
        (
            {"axes": {"data": 2}, "model": {"kind": "mlp", "features": [2, 2], "dtype": "float32"}},
            "model.dtype need a hardware plan",
        ),
        (
            {**HARDWARE, "model": {"kind": "mlp", "features": [2, 2], "optimizer": "sgd"}},
            "model.optimizer do not apply",
        ),
        ({**HARDWARE, "model": {"kind": "mlp", "features": [2, 2]}}, "needs batch_shape"),
    ],
    ids=[
        "no-axes",
        "ici-alone",
        "mixed",
        "no-ici",
        "maxtext-alone",
        "maxtext-and-ici",
        "big",
        "named-model-live",
        "mlp-dtype-live",
        "mlp-optimizer-hardware",
        "model-no-batch",
    ],
)
def test_plain_and_hardware_fields_do_not_mix(body, message):
    with pytest.raises(ValidationError, match=message):
        MeshPlanRequest.model_validate(body)


def test_maxtext_strings_are_bounded():
    body = {"hardware": "tpu-v5e", "topology": "4x4"}
    parsed = MeshPlanRequest.model_validate({**body, "maxtext": {"model_name": "x"}}).root
    assert isinstance(parsed, MaxTextPlanBody) and parsed.maxtext
    with pytest.raises(ValidationError, match=f"at most {MAX_MAXTEXT_TEXT}"):
        MeshPlanRequest.model_validate(
            {**body, "maxtext": {"model_name": "x" * (MAX_MAXTEXT_TEXT + 1)}}
        )


def test_shared_hardware_fields_keep_the_hardware_plans_bounds_and_docs():
    ours, theirs = HardwarePlanBody.model_fields, HardwarePlanRequest.model_fields
    for name in ("topology", "slices", "hosts", "dcn", "allow_split_physical_axes"):
        assert ours[name].default == theirs[name].default, name
        assert ours[name].description == theirs[name].description, name
    for name in ("topology", "slices", "hosts"):
        assert MaxTextPlanBody.model_fields[name].description == theirs[name].description
    with pytest.raises(ValidationError):
        MeshPlanRequest.model_validate({**HARDWARE, "slices": 0})
