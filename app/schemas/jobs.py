"""Job metric history requests, multi-host partial pushes included (docs/API.md, "A job's
metric history"). The answers are :mod:`datarax.answers.jobs`."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import (
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from app.schemas.base import JsonInt, Strict
from app.schemas.metrics import (
    METRICS_REQUEST_EXAMPLE,
    MetricsReduceRequest,
    NumberList,
    Tensor,
)

JOB_NAME_PATTERN = r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,126}[A-Za-z0-9_-])?$"
"""1-128 of letters, digits, ``.``, ``_`` and ``-``, starting with a letter or digit and
not ending with ``.``: ``.``, ``..`` and ``...`` are path segments that clients and proxies
rewrite or drop (RFC 3986 dot-segments; trailing dots are stripped by some), so a job so
named could be pushed to but never read back."""
JOB_NAME_RULE = (
    "1-128 of letters, digits, '.', '_' and '-', starting with a letter or digit, "
    "not ending with '.'"
)
SOURCE_CHARS = r"[A-Za-z0-9._:-]{0,128}"
"""What a source name is (the one rule: the request models, the ``?source=`` query and the
decoder's plain-form check all use it): 0-128 of ASCII letters, digits, ``.``, ``_``,
``:`` and ``-``."""
SOURCE_PATTERN = rf"^{SOURCE_CHARS}$"
_SOURCE_NAME = re.compile(SOURCE_CHARS)


def is_source_name(text: str) -> bool:
    """Whether ``text`` is a valid ``source`` (:data:`SOURCE_CHARS`, the whole string)."""
    return _SOURCE_NAME.fullmatch(text) is not None


MAX_STEP = 2**63 - 1
"""Steps are SQLite integers: 0 .. 2**63 - 1."""
MAX_SOURCES = 4096
MAX_BATCH_POINTS = 1000
"""Points per batch push (MLflow's ``log_batch`` takes up to 1,000 metrics)."""
MAX_METRIC_NAME = 250
"""Characters of a metric name (MLflow's limit for a metric key, ``MAX_ENTITY_KEY_LENGTH``
= 250 in ``mlflow/utils/validation.py``)."""

Step = Annotated[
    JsonInt,
    Field(ge=0, le=MAX_STEP, description="training step, 0 .. 2**63-1 (1000 or 1000.0)"),
]
Source = Annotated[
    str,
    Field(
        pattern=SOURCE_PATTERN,
        description="who pushes this part (e.g. 'host-3', or jax.process_index()); "
        "default ''. 0-128 of letters, digits, '.', '_', ':' and '-'",
    ),
]
Sources = Annotated[
    JsonInt,
    Field(ge=1, le=MAX_SOURCES, description="how many sources push parts of each step"),
]

JOB_POINT_EXAMPLE: dict[str, Any] = {**METRICS_REQUEST_EXAMPLE, "step": 10}
JOB_PART_EXAMPLE: dict[str, Any] = {
    "metrics": {"loss": [0.9, 1.1], "lr": 0.001},
    "step": 10,
    "source": "host-0",
    "sources": 2,
}


class JobMetricsRequest(MetricsReduceRequest):
    """The reduce body plus ``step``; a scalar metric (``"lr": 0.001``) is a value every
    device agrees on and is stored as given."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [JOB_POINT_EXAMPLE, JOB_PART_EXAMPLE]}
    )

    # Wider than the reduce body's (a job point takes scalars too). Overridden in place so
    # the field keeps its position: properties and validation errors stay in body order.
    metrics: dict[str, NumberList | Tensor | StrictFloat | StrictInt] = Field(  # type: ignore[assignment]
        description="name -> stacked per-device values (leading axis = this source's "
        "devices), or a scalar every device agrees on"
    )
    step: Step
    source: Source = ""
    sources: Sources = 1


class JobBatchRequest(Strict):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "points": [
                        {"step": 1, "metrics": {"loss": [0.9, 1.1], "lr": 0.001}},
                        {"step": 2, "metrics": {"loss": [0.8, 1.0], "lr": 0.001}},
                    ]
                }
            ]
        },
    )

    points: list[JobMetricsRequest] = Field(
        min_length=1,
        max_length=MAX_BATCH_POINTS,
        description=f"1 to {MAX_BATCH_POINTS} single-push bodies; stored all or nothing",
    )
    source: Source | None = Field(None, description="default source of every point")
    sources: Sources | None = Field(None, description="default sources of every point")


class JobPatchRequest(Strict):
    # At least one member, none of them null: the schema says so as the validator does.
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"finished": True}, {"plan": "3f2a9c", "step_time_metric": "step_time"}],
            "minProperties": 1,
        },
    )

    finished: StrictBool | SkipJsonSchema[None] = Field(
        None, description="true: finished; false: reopened"
    )
    plan: Annotated[str, Field(min_length=1, max_length=64)] | SkipJsonSchema[None] = Field(
        None, description="links the job to this stored plan: the job then answers fidelity"
    )
    step_time_metric: Annotated[str, Field(min_length=1, max_length=256)] | SkipJsonSchema[None] = (
        Field(None, description="the pushed metric holding seconds a step (default step_time)")
    )

    @model_validator(mode="after")
    def _something(self) -> JobPatchRequest:
        if self.finished is None and self.plan is None and self.step_time_metric is None:
            raise ValueError("give finished, plan or step_time_metric")
        return self
