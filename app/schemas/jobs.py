"""Job metric history requests and answers, multi-host partial pushes included (docs/API.md,
"A job's metric history")."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
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


class MetricSpread(BaseModel):
    """A metric's spread over devices: its smallest and largest finite value and the
    devices holding them (index along the pushed device axis; for parts, the merged one)."""

    min: float
    max: float
    min_device: int
    max_device: int
    min_step: int | SkipJsonSchema[None] = Field(
        None, description="bucket rows only: the step of min"
    )
    max_step: int | SkipJsonSchema[None] = Field(
        None, description="bucket rows only: the step of max"
    )


class JobPointOut(BaseModel):
    """One row of ``points``: a stored step, or (downsampled answers) one bucket."""

    step: int = Field(
        description="the step; for a bucket row, the newest step in the bucket with a value"
    )
    reduced: dict[str, Any] | None = Field(
        description="the step's reduced values (for a partial step: over the parts so far; "
        "for a bucket row: each scalar metric's mean over the bucket, null where the "
        "bucket holds no finite value)"
    )
    received_at: str | None = Field(
        description="RFC 3339 UTC; null for a bucket row (a bucket spans many pushes)"
    )
    complete: bool = Field(description="every source of the step has arrived")
    sources: int | None = Field(1, description="sources of the step; null for a bucket row")
    received_sources: list[str] | None = Field(None, description="partial steps only")
    missing_sources: list[str] | None = Field(
        None,
        description="partial steps only: the sources not yet received, when their names "
        "follow one pattern (a prefix and 0..sources-1), else null",
    )
    spread: dict[str, MetricSpread] | SkipJsonSchema[None] = Field(
        None,
        description="per metric that had more than one device value (finite values only): "
        "min, max and the devices holding them; for a bucket row, the extremes over the "
        "bucket with their steps; absent for partial steps and single-device metrics",
    )
    start_step: int | None = Field(None, description="bucket rows only: first step covered")
    end_step: int | None = Field(None, description="bucket rows only: last step covered")
    count: int | None = Field(
        None, description="bucket rows only: most values any metric has in the bucket"
    )


class JobPointCreated(BaseModel):
    job: str
    step: int
    source: str
    sources: int
    complete: bool
    reduced: dict[str, Any] | None = Field(description="the step's values once complete")
    received_at: str
    num_devices: int = Field(description="devices of this push (this source's part)")
    missing_sources: list[str] | None = None
    warnings: list[str] = Field(
        [], description="metrics that held NaN or infinite values, and what nan_policy did"
    )


class JobBatchResult(BaseModel):
    job: str
    points: int = Field(description="points in the batch")
    created: int = Field(description="points or parts newly stored")
    unchanged: int = Field(description="identical retries (no-ops)")
    completed_steps: int = Field(description="steps that became complete with this batch")
    received_at: str
    warnings: list[str] = Field(
        [], description="metrics that held NaN or infinite values, and what nan_policy did"
    )


class JobHistory(BaseModel):
    """One history answer shape for both reads (issue 27): ``points`` is always there,
    ``kind`` says what its rows are. A plain read (``kind: "points"``) has one row per
    stored step. A downsampled read (``kind: "buckets"``, ``downsampled: true``) has one
    row per bucket in ``points`` (``step``: the bucket's newest step with a value,
    ``reduced``: each metric's bucket mean, plus ``start_step``, ``end_step``, ``count``)
    and keeps ``buckets`` with ``min``, ``max``, ``mean`` and ``last`` per metric. A script
    that reads ``points[i]["step"]`` and ``points[i]["reduced"]`` works on both."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "job": "llm-sweep-7",
                    "kind": "points",
                    "downsampled": False,
                    "points": [
                        {
                            "step": 10,
                            "reduced": {"loss": 1.0},
                            "received_at": "2026-12-01T08:00:00Z",
                            "complete": True,
                            "sources": 1,
                        }
                    ],
                    "next_after_step": None,
                },
                {
                    "job": "llm-sweep-7",
                    "kind": "buckets",
                    "downsampled": True,
                    "bucket_steps": 256,
                    "points": [
                        {
                            "step": 255,
                            "reduced": {"loss": 1.2},
                            "received_at": None,
                            "complete": True,
                            "sources": None,
                            "start_step": 0,
                            "end_step": 255,
                            "count": 256,
                        }
                    ],
                    "buckets": [
                        {
                            "start_step": 0,
                            "end_step": 255,
                            "metrics": {
                                "loss": {
                                    "count": 256,
                                    "min": 0.9,
                                    "max": 2.0,
                                    "mean": 1.2,
                                    "last": 0.95,
                                    "last_step": 255,
                                }
                            },
                        }
                    ],
                    "next_after_step": None,
                },
            ]
        }
    )

    job: str
    kind: Literal["points", "buckets"] = Field(
        description="'points': a row per stored step; 'buckets': a row per bucket"
    )
    downsampled: bool = Field(description="true exactly when kind is 'buckets'")
    points: list[JobPointOut] = Field(description="in step order (both kinds)")
    next_after_step: int | None = Field(
        None,
        description="pass as after_step for the next page; null on the last page. A page "
        "is also cut short to stay within DATARAX_MAX_ANSWER_MB",
    )
    bucket_steps: int | None = Field(None, description="downsampled: steps per bucket")
    buckets: list[dict[str, Any]] | None = Field(
        None,
        description="downsampled: {start_step, end_step, metrics: {name: {count, min, max, "
        "mean, last, last_step}}, spread: {name: {min, max, min_device, max_device, "
        "min_step, max_step}}} over the scalar metrics of complete steps (spread: the "
        "extremes over devices, where steps had more than one device value)",
    )


class JobFidelity(BaseModel):
    """A linked job's plan against its measured steps."""

    plan: str
    step_time_metric: str
    predicted_step_s: float | None = Field(description="the plan's step_estimate.step_s")
    measured_step_s: float | None = Field(description="the median of the measured steps")
    error: float | None = Field(description="predicted / measured - 1")
    points: int = Field(description="measured steps the median is over")


class JobSummary(BaseModel):
    job: str
    points: int = Field(description="complete steps stored")
    first_step: int | None
    last_step: int | None
    last_push_at: str
    finished: bool
    created_at: str
    incomplete_step: int | None = Field(description="the newest step still missing sources")
    lagging_sources: list[str] | None = Field(
        description="at incomplete_step: the missing sources' names when known"
    )
    missing_count: int = Field(description="at incomplete_step: how many sources are missing")
    fidelity: JobFidelity | None = Field(
        None, description="with a plan linked (PATCH plan): predicted against measured"
    )


class JobList(BaseModel):
    items: list[JobSummary]
    total: int
