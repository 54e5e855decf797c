"""Shared request pieces: an integer is what JSON Schema calls one (``62.0`` too, never
``true`` or ``"62"``), unknown members are refused, and an optimizer is a name or an object."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from app.schemas.base import (
    MAX_OPTIMIZER_EXTRAS,
    JsonInt,
    OptimizerSpec,
    Strict,
    optimizer_name,
)
from tests.helpers import assert_problem

INTEGER = TypeAdapter(JsonInt)


def _plan(api, **body):
    return api.post("/v1/meshes", json={"axes": {"data": 2, "model": -1}, **body})


def test_integer_valued_floats_are_integers(api):
    answer = _plan(api, num_devices=8.0, batch_shape=[64.0, 16])
    assert answer.status_code == 201, answer.text
    assert answer.json()["total_devices"] == 8
    reduced = api.post(
        "/v1/metrics/reduce",
        json={"metrics": {"x": {"shape": [2.0], "datatype": "FP32", "data": [1, 3]}}},
    )
    assert reduced.status_code == 200, reduced.text
    assert reduced.json()["reduced"]["x"] == 2.0


@pytest.mark.parametrize("value", [8.5, True, "8"], ids=["fraction", "bool", "string"])
def test_other_non_integers_are_refused(api, value):
    assert_problem(_plan(api, num_devices=value), 422, "validation_error")


@pytest.mark.parametrize(("value", "parsed"), [(62, 62), (62.0, 62), (-3.0, -3)])
def test_json_int_takes_integral_numbers(value, parsed):
    assert INTEGER.validate_python(value) == parsed
    assert type(INTEGER.validate_python(value)) is int


@pytest.mark.parametrize("value", [62.5, True, "62", None])
def test_json_int_refuses_the_rest(value):
    with pytest.raises(ValidationError):
        INTEGER.validate_python(value)


def test_strict_models_refuse_unknown_members():
    class Point(Strict):
        x: int

    with pytest.raises(ValidationError, match="y"):
        Point.model_validate({"x": 1, "y": 2})


def test_an_optimizer_is_a_name_or_an_object_of_a_few_scalars():
    assert optimizer_name(None) == "adam" and optimizer_name(None, "sgd") == "sgd"
    assert optimizer_name("adamw") == "adamw"
    spec = OptimizerSpec.model_validate({"name": "sgd", "learning_rate": 0.1, "momentum": 0.9})
    assert optimizer_name(spec) == "sgd" and spec.model_extra == {"momentum": 0.9}
    too_many = {f"k{i}": 1 for i in range(MAX_OPTIMIZER_EXTRAS + 1)}
    for bad in ({"learning_rate": 0}, {"b1": [0.9]}, {"x" * 65: 1}, too_many):
        with pytest.raises(ValidationError):
            OptimizerSpec.model_validate(bad)
