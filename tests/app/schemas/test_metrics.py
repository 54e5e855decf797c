"""Metric request schemas: what they refuse is what the OpenAPI document says they do."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.schemas.metrics import MetricsReduceRequest, Tensor
from tests.helpers import assert_problem


def test_the_schema_bounds_what_the_service_refuses(api):
    """Empty metrics and axes and all-zero weights are refused with their own codes; the
    OpenAPI schema says so, so that schema-valid requests are never refused for them."""
    schemas = api.get("/openapi.json").json()["components"]["schemas"]
    for mode in ("LivePlanBody", "AbstractPlanBody"):  # the plan modes over axes
        assert schemas[mode]["properties"]["axes"]["minProperties"] == 1
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


def test_a_tensor_is_a_shape_a_datatype_and_flat_data():
    tensor = Tensor.model_validate({"shape": [2.0, 2], "datatype": "FP32", "data": [1, 2, 3, 4]})
    assert tensor.shape == [2, 2]
    with pytest.raises(ValidationError):
        Tensor.model_validate({"shape": [-1], "datatype": "FP32", "data": []})
    with pytest.raises(ValidationError):
        Tensor.model_validate({"shape": [1], "datatype": "FP32", "data": [1], "x": 1})


def test_a_reduce_request_takes_lists_or_tensors():
    body = MetricsReduceRequest.model_validate(
        {"metrics": {"a": [1, 2], "b": {"shape": [2], "datatype": "INT32", "data": [3, 4]}}}
    )
    assert isinstance(body.metrics["b"], Tensor) and body.metrics["a"] == [1, 2]
