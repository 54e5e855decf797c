"""Job metric history answers: pushes (``POST /v1/jobs/{job}/metrics`` and ``/batch``), the
history (``GET /v1/jobs/{job}/metrics``) and the jobs (``GET /v1/jobs``,
``GET``/``PATCH /v1/jobs/{job}``). Multi-host partial pushes: docs/API.md, "A job's metric
history"; non-finite floats are ``null``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from datarax.answers.base import Answer, examples, omitted
from datarax.answers.metrics import MetricValue

__all__ = [
    "BatchResult",
    "Bucket",
    "BucketMetric",
    "History",
    "HistoryPoint",
    "JobFidelity",
    "JobList",
    "JobSummary",
    "MetricSpread",
    "PushResult",
]


@dataclass(frozen=True, eq=False)
class PushResult(Answer):
    """``POST /v1/jobs/{job}/metrics``: the stored step (or this source's part of it)."""

    job: str
    step: int
    source: str
    sources: int
    complete: bool
    reduced: dict[str, MetricValue] | None
    """the step's values once complete"""
    received_at: str
    num_devices: int
    """devices of this push (this source's part)"""
    missing_sources: list[str] | None
    """while the step is partial: the sources not yet received, when their names follow one
    pattern (a prefix and 0..sources-1), else null"""
    warnings: list[str] = field(default_factory=list)
    """metrics that held NaN or infinite values, and what nan_policy did"""


@dataclass(frozen=True, eq=False)
class BatchResult(Answer):
    """``POST /v1/jobs/{job}/metrics/batch``."""

    job: str
    points: int
    """points in the batch"""
    created: int
    """points or parts newly stored"""
    unchanged: int
    """identical retries (no-ops)"""
    completed_steps: int
    """steps that became complete with this batch"""
    received_at: str
    warnings: list[str] = field(default_factory=list)
    """metrics that held NaN or infinite values, and what nan_policy did"""


@dataclass(frozen=True, eq=False)
class MetricSpread(Answer):
    """A metric's spread over devices: its smallest and largest finite value and the
    devices holding them (index along the pushed device axis; for parts, the merged one);
    a bucket's adds the steps of each."""

    min: float
    max: float
    min_device: int
    max_device: int
    min_step: int | None = omitted()
    """bucket rows only: the step of min"""
    max_step: int | None = omitted()
    """bucket rows only: the step of max"""


@dataclass(frozen=True, eq=False)
class HistoryPoint(Answer):
    """One row of a history answer's ``points``: a stored step, or (downsampled answers)
    one bucket, with ``start_step``, ``end_step`` and ``count``, and ``received_at`` and
    ``sources`` null. Partial steps add ``received_sources`` (and ``missing_sources``)."""

    step: int
    """the step; for a bucket row, the newest step in the bucket with a value"""
    reduced: dict[str, MetricValue] | None
    """the step's reduced values (for a partial step: over the parts so far; for a bucket
    row: each scalar metric's mean over the bucket, null where the bucket holds no finite
    value)"""
    received_at: str | None
    """RFC 3339 UTC; null for a bucket row (a bucket spans many pushes)"""
    complete: bool
    """every source of the step has arrived"""
    sources: int | None
    """sources of the step; null for a bucket row"""
    received_sources: list[str] | None = omitted()
    """partial steps only"""
    missing_sources: list[str] | None = omitted()
    """partial steps only: the sources not yet received, when their names follow one
    pattern (a prefix and 0..sources-1), else null"""
    spread: dict[str, MetricSpread] | None = omitted()
    """per metric that had more than one device value (finite values only): min, max and
    the devices holding them; for a bucket row, the extremes over the bucket with their
    steps; absent for partial steps and single-device metrics"""
    start_step: int | None = omitted()
    """bucket rows only: first step covered"""
    end_step: int | None = omitted()
    """bucket rows only: last step covered"""
    count: int | None = omitted()
    """bucket rows only: most values any metric has in the bucket"""


@dataclass(frozen=True, eq=False)
class BucketMetric(Answer):
    """One scalar metric's figures over a bucket (null: no finite value)."""

    count: int
    min: float | None
    max: float | None
    mean: float | None
    last: float | None
    last_step: int


@dataclass(frozen=True, eq=False)
class Bucket(Answer):
    """One bucket of a downsampled history: each scalar metric's figures over the complete
    steps it covers, and their spread over devices where steps had more than one device
    value."""

    start_step: int
    end_step: int
    metrics: dict[str, BucketMetric]
    spread: dict[str, MetricSpread] | None = omitted()
    """the extremes over devices of the bucket's steps, with their devices and steps"""


_POINTS_EXAMPLE: dict[str, Any] = {
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
}
_BUCKETS_EXAMPLE: dict[str, Any] = {
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
}


@dataclass(frozen=True, eq=False)
class History(Answer):
    """``GET /v1/jobs/{job}/metrics``: one history answer shape for both reads (issue 27):
    ``points`` is always there, ``kind`` says what its rows are. A plain read (``kind:
    "points"``) has one row per stored step. A downsampled read (``kind: "buckets"``,
    ``downsampled: true``) has one row per bucket in ``points`` (``step``: the bucket's
    newest step with a value, ``reduced``: each metric's bucket mean, plus ``start_step``,
    ``end_step``, ``count``) and keeps ``buckets`` with ``min``, ``max``, ``mean`` and
    ``last`` per metric. A script that reads ``points[i]["step"]`` and
    ``points[i]["reduced"]`` works on both."""

    __pydantic_config__: ClassVar[dict[str, Any]] = examples(_POINTS_EXAMPLE, _BUCKETS_EXAMPLE)

    job: str
    kind: Literal["points", "buckets"]
    """'points': a row per stored step; 'buckets': a row per bucket"""
    downsampled: bool
    """true exactly when kind is 'buckets'"""
    points: list[HistoryPoint]
    """in step order (both kinds)"""
    next_after_step: int | None
    """pass as after_step for the next page; null on the last page. A page is also cut
    short to stay within DATARAX_MAX_ANSWER_MB"""
    bucket_steps: int | None = omitted()
    """downsampled: steps per bucket"""
    buckets: list[Bucket] | None = omitted()
    """downsampled: per bucket, each scalar metric's count, min, max, mean, last and
    last_step over the complete steps, and the spread over devices where steps had more
    than one device value"""


@dataclass(frozen=True, eq=False)
class JobFidelity(Answer):
    """A linked job's plan against its measured steps: ``error`` is ``predicted /
    measured - 1`` (positive: the plan predicted a slower step than the job ran)."""

    plan: str
    step_time_metric: str
    predicted_step_s: float | None
    """the plan's step_estimate.step_s"""
    measured_step_s: float | None
    """the median of the measured steps"""
    error: float | None
    """predicted / measured - 1"""
    points: int
    """measured steps the median is over"""


@dataclass(frozen=True, eq=False)
class JobSummary(Answer):
    """``GET /v1/jobs/{job}``: the job's progress; ``incomplete_step`` the newest step
    still missing sources; ``fidelity`` with a plan linked."""

    job: str
    points: int
    """complete steps stored"""
    first_step: int | None
    last_step: int | None
    last_push_at: str
    finished: bool
    created_at: str
    incomplete_step: int | None
    """the newest step still missing sources"""
    lagging_sources: list[str] | None
    """at incomplete_step: the missing sources' names when known"""
    missing_count: int
    """at incomplete_step: how many sources are missing"""
    fidelity: JobFidelity | None
    """with a plan linked (PATCH plan): predicted against measured"""


@dataclass(frozen=True, eq=False)
class JobList(Answer):
    """``GET /v1/jobs``: most recently pushed first."""

    # field(): a bare annotation would take Mapping.items (the method) as its default.
    items: list[JobSummary] = field()  # type: ignore[assignment]
    total: int
