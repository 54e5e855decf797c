"""Job metric answers.

Transitional: these are the client's TypedDicts, moved here to become
:class:`~datarax.answers.base.Answer` dataclasses (one definition read by the service and
the client)."""

from typing import Literal, NotRequired, TypedDict

from datarax.answers.metrics import MetricValue


class PushResult(TypedDict):
    """``POST /v1/jobs/{job}/metrics``: the stored step (or this source's part of it)."""

    job: str
    step: int
    source: str
    sources: int
    complete: bool
    reduced: dict[str, MetricValue] | None
    received_at: str
    num_devices: int
    missing_sources: list[str] | None
    warnings: NotRequired[list[str]]


class BatchResult(TypedDict):
    """``POST /v1/jobs/{job}/metrics/batch``."""

    job: str
    points: int
    created: int
    unchanged: int
    completed_steps: int
    received_at: str
    warnings: NotRequired[list[str]]


class MetricSpread(TypedDict):
    """A metric's spread over devices: its smallest and largest finite value and the
    devices holding them; a bucket row adds the steps of each."""

    min: float
    max: float
    min_device: int
    max_device: int
    min_step: NotRequired[int]
    max_step: NotRequired[int]


class HistoryPoint(TypedDict):
    """One row of a history answer's ``points``: a stored step, or (downsampled) one
    bucket, with ``start_step``, ``end_step`` and ``count`` and ``received_at`` and
    ``sources`` null. Partial steps add ``received_sources`` and ``missing_sources``."""

    step: int
    reduced: dict[str, MetricValue] | None
    received_at: str | None
    complete: bool
    sources: int | None
    received_sources: NotRequired[list[str]]
    missing_sources: NotRequired[list[str] | None]
    spread: NotRequired[dict[str, MetricSpread]]
    start_step: NotRequired[int]
    end_step: NotRequired[int]
    count: NotRequired[int]


class BucketMetric(TypedDict):
    count: int
    min: float | None
    max: float | None
    mean: float | None
    last: float | None
    last_step: int


class Bucket(TypedDict):
    """One bucket of a downsampled history: each scalar metric's figures over it."""

    start_step: int
    end_step: int
    metrics: dict[str, BucketMetric]


class History(TypedDict):
    """A ``GET /v1/jobs/{job}/metrics`` answer. ``kind`` is ``"points"`` (a row per
    stored step) or ``"buckets"`` (downsampled: a row per bucket, ``reduced`` holding each
    metric's bucket mean, plus ``start_step``, ``end_step``, ``count``); ``points`` is
    there in both, so ``for p in page["points"]: p["step"], p["reduced"]`` reads either.
    :func:`~datarax.client.history_points` gives those rows from older services' answers
    too."""

    job: str
    kind: Literal["points", "buckets"]
    downsampled: bool
    points: list[HistoryPoint]
    next_after_step: int | None
    bucket_steps: NotRequired[int]
    buckets: NotRequired[list[Bucket]]


class JobFidelity(TypedDict):
    """A linked job's plan against its measured steps: ``error`` is ``predicted /
    measured - 1``; ``measured_step_s`` the median of the pushed step times."""

    plan: str
    step_time_metric: str
    predicted_step_s: float | None
    measured_step_s: float | None
    error: float | None
    points: int


class JobSummary(TypedDict):
    """``GET /v1/jobs/{job}``: the job's progress; ``incomplete_step`` the newest step
    still missing sources; ``fidelity`` with a plan linked."""

    job: str
    points: int
    first_step: int | None
    last_step: int | None
    last_push_at: str
    finished: bool
    created_at: str
    incomplete_step: int | None
    lagging_sources: list[str] | None
    missing_count: int
    fidelity: JobFidelity | None


class JobList(TypedDict):
    """``GET /v1/jobs``: most recently pushed first."""

    items: list[JobSummary]
    total: int


__all__ = [
    "PushResult",
    "BatchResult",
    "MetricSpread",
    "HistoryPoint",
    "BucketMetric",
    "Bucket",
    "History",
    "JobFidelity",
    "JobSummary",
    "JobList",
]
