"""Device, health and memory-budget answers: the documented example is a valid answer."""

from __future__ import annotations

from app.schemas.devices import DevicesResponse, MemoryBudget


def test_the_documented_example_is_a_devices_answer():
    example = DevicesResponse.model_config["json_schema_extra"]["examples"][0]
    answer = DevicesResponse.model_validate(example)
    assert answer.platform == example["platform"]
    assert [d.id for d in answer.devices] == [d["id"] for d in example["devices"]]


def test_a_budget_without_an_accelerator_has_no_device_figure():
    budget = MemoryBudget.model_validate({"host": 2**30, "device": None})
    assert budget.model_dump() == {"host": 2**30, "device": None}
