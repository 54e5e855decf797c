"""Hardware plan and recommendation requests: the model union told apart by kind or name,
and each request's examples valid against its own model."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from app.schemas.hardware import (
    HARDWARE_PLAN_EXAMPLE,
    RECOMMENDATION_EXAMPLE,
    HardwareMlpModel,
    HardwareModel,
    HardwarePlanRequest,
    NamedModel,
    RecommendationRequest,
    TransformerModel,
    model_tag,
)

MODEL = TypeAdapter(HardwareModel)
TRANSFORMER = {
    "kind": "transformer", "layers": 2, "d_model": 64, "d_ff": 256, "heads": 4,
    "kv_heads": 4, "vocab": 100, "seq_len": 16,
}  # fmt: skip


def test_the_model_union_follows_kind_or_name():
    assert isinstance(MODEL.validate_python({"kind": "mlp", "features": [4, 2]}), HardwareMlpModel)
    assert isinstance(MODEL.validate_python(TRANSFORMER), TransformerModel)
    named = MODEL.validate_python({"name": "llama3.1-8b", "layers": 2})
    assert isinstance(named, NamedModel) and named.layers == 2
    assert model_tag({"name": "x", "kind": "transformer"}) == "named"  # a name wins


def test_a_model_without_kind_or_name_is_invalid_model():
    with pytest.raises(ValidationError) as err:
        MODEL.validate_python({"layers": 2})
    assert err.value.errors()[0]["type"] == "invalid_model"


def test_the_examples_are_valid_requests():
    plan = HardwarePlanRequest.model_validate(HARDWARE_PLAN_EXAMPLE)
    assert plan.slices == 2 and plan.ici == {"data": 1, "fsdp": -1, "tensor": 4}
    recommendation = RecommendationRequest.model_validate(RECOMMENDATION_EXAMPLE)
    assert isinstance(recommendation.model, TransformerModel)


def test_a_hardware_plan_defaults_and_bounds():
    plan = HardwarePlanRequest.model_validate({"hardware": "tpu-v5e", "ici": {"data": -1}})
    assert (plan.topology, plan.slices, plan.hosts, plan.optimizer) == (None, 1, None, "adam")
    for bad in ({"slices": 0}, {"hosts": 70_000}, {"topology": "x" * 65}, {"extra": 1}):
        with pytest.raises(ValidationError):
            HardwarePlanRequest.model_validate({"hardware": "tpu-v5e", "ici": {"d": 1}, **bad})
