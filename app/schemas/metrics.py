"""Metric reduction requests (the answers are :mod:`datarax.answers.metrics`).

JSON numbers: JSON has no NaN or infinity. In requests, ``NaN``, ``Infinity`` and
``-Infinity`` literals (what Python's ``json.dumps`` writes) and ``null`` are accepted in
float metric data and read as non-finite values. In responses every non-finite float is
``null``.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from app.codecs.json_arrays import OIP_DTYPES
from app.schemas.base import JsonInt, Strict
from datarax.metrics.reductions import NAN_POLICIES, REDUCE_OPS

OIP_DATATYPES = tuple(OIP_DTYPES)

NESTED_NUMBER_SCHEMA: dict[str, Any] = {
    "description": "a number, true/false, null (NaN) or a nested list of them",
    "anyOf": [
        {"type": "number"},
        {"type": "boolean"},
        {"type": "null"},
        {"type": "array", "items": {"$ref": "#/components/schemas/NestedNumber"}},
    ],
}
"""``NestedNumber`` in the OpenAPI components (``app.api.openapi``): what a JSON metric, batch
or tensor ``data`` list holds. Validation stays ``list[Any]`` (decoding checks the items)."""

NumberList = Annotated[
    list[Any],
    WithJsonSchema({"type": "array", "items": {"$ref": "#/components/schemas/NestedNumber"}}),
]

METRICS_REQUEST_EXAMPLE: dict[str, Any] = {
    "metrics": {
        "loss": [0.9, 1.1, 1.0, 1.0],
        "accuracy": {"shape": [4], "datatype": "FP32", "data": [0.5, 0.6, 0.7, 0.8]},
        "step": [10, 10, 10, 10],
    },
    "reduce": {"loss": "mean", "accuracy": "mean", "step": "max"},
    "weights": [32, 32, 32, 16],
    "nan_policy": "propagate",
}


class Tensor(Strict):
    """An Open Inference Protocol v2 style tensor: row-major flat ``data``."""

    # JSON Schema cannot say "len(data) == prod(shape)"; it can say its commonest breach:
    # empty data needs a 0 in the shape.
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "if": {"properties": {"data": {"maxItems": 0}}, "required": ["data"]},
            "then": {"properties": {"shape": {"contains": {"const": 0}}}},
        },
    )

    shape: list[Annotated[JsonInt, Field(ge=0)]] = Field(
        examples=[[4]],
        description="at most 64 sizes that numpy can hold; an empty shape (a 0 size) with "
        "other sizes multiplying past 2**20 is 422 invalid_tensor",
    )
    datatype: str = Field(
        examples=["FP32"],
        description=f"one of {', '.join(OIP_DATATYPES)} (BF16 and BYTES are not supported)",
        json_schema_extra={"enum": list(OIP_DATATYPES)},
    )
    data: NumberList = Field(
        description="exactly prod(shape) values, row-major (nested lists allowed); another "
        "count is 422 invalid_tensor"
    )


MetricValue = NumberList | Tensor

_METRICS_DESCRIPTION = (
    "name -> stacked per-device values, leading axis = devices: a nested JSON list or an "
    "OIP tensor. NaN/Infinity literals and null are read as non-finite floats"
)
_NAN_POLICY_DESCRIPTION = (
    "propagate: non-finite values flow into the result (as null); omit: ignore non-finite "
    "entries per position; raise: 422 non_finite_values"
)


class MetricsReduceRequest(Strict):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [METRICS_REQUEST_EXAMPLE]}
    )

    metrics: dict[str, MetricValue] = Field(
        description=_METRICS_DESCRIPTION,
        json_schema_extra={"minProperties": 1},  # {} is 422 empty_metrics
    )
    reduce: dict[str, str] = Field(
        default_factory=dict,
        description=f"name -> operation ({', '.join(REDUCE_OPS)}); unlisted metrics use mean. "
        "Integer sums are exact or 422 integer_overflow, never wrapped",
    )
    weights: list[float] | None = Field(
        None,
        description="[n_devices] weights making 'mean' a weighted mean: finite, >= 0, not all zero",
        # "not every item is 0" (also refuses []): all-zero weights are 422 invalid_weights
        json_schema_extra={
            "items": {"minimum": 0},
            "not": {"type": "array", "items": {"const": 0}},
        },
    )
    nan_policy: str = Field(
        "propagate",
        description=_NAN_POLICY_DESCRIPTION,
        json_schema_extra={"enum": list(NAN_POLICIES)},
    )


class MetricsCollectRequest(BaseModel):
    """``metrics`` as for reduce. ``reduce``/``weights``/``nan_policy`` are ignored, so the
    same body can be sent to both endpoints."""

    model_config = ConfigDict(
        extra="ignore", json_schema_extra={"examples": [{"metrics": {"loss": [0.9, 1.1]}}]}
    )

    metrics: dict[str, MetricValue] = Field(
        description=_METRICS_DESCRIPTION,
        json_schema_extra={"minProperties": 1},  # {} is 422 empty_metrics
    )
