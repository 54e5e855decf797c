"""Schema-valid requests are accepted: JSON Schema's ``integer`` includes ``62.0``, so an
integer-valued float is an integer everywhere the schema says integer; ``62.5``, ``true``
and ``"62"`` stay 422."""

from __future__ import annotations

import pytest

from tests.helpers import assert_problem


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


def test_the_schema_bounds_what_the_service_refuses(api):
    """Empty metrics and axes and all-zero weights are refused with their own codes; the
    OpenAPI schema says so, so that schema-valid requests are never refused for them."""
    schemas = api.get("/openapi.json").json()["components"]["schemas"]
    assert schemas["MeshPlanRequest"]["properties"]["axes"]["minProperties"] == 1
    reduce = schemas["MetricsReduceRequest"]["properties"]
    assert reduce["metrics"]["minProperties"] == 1
    assert reduce["weights"]["not"] == {"type": "array", "items": {"const": 0}}
    assert_problem(api.post("/v1/metrics/reduce", json={"metrics": {}}), 422, "empty_metrics")
    zero = {"metrics": {"x": [1, 2]}, "weights": [0, 0]}
    assert_problem(api.post("/v1/metrics/reduce", json=zero), 422, "invalid_weights")


def test_the_schema_refuses_empty_data_for_a_non_empty_shape(api):
    """A tensor with shape [4] and data [] is refused (invalid_tensor), and the schema says
    so: empty data needs a 0 in the shape."""
    tensor = api.get("/openapi.json").json()["components"]["schemas"]["Tensor"]
    assert tensor["if"] == {"properties": {"data": {"maxItems": 0}}, "required": ["data"]}
    assert tensor["then"] == {"properties": {"shape": {"contains": {"const": 0}}}}
    empty = {"metrics": {"x": {"shape": [4], "datatype": "FP32", "data": []}}}
    assert_problem(api.post("/v1/metrics/reduce", json=empty), 422, "invalid_tensor")
