"""A Python client of the datarax mesh service: sync (:class:`Client`) and async
(:class:`AsyncClient`), on httpx. It imports nothing of the service (no FastAPI, no
pydantic), so a training job installs only ``httpx`` and ``numpy`` besides JAX.

- Every method returns the service's answer parsed into its class, the one the service
  itself serialises (:mod:`datarax.answers`, re-exported by :mod:`datarax.client.answers`
  and here), e.g. ``api.get_job("run-1")`` is a :class:`JobSummary`
  (``summary.last_step``; ``summary["last_step"]`` reads it too: an answer is a read-only
  mapping of its JSON members); on :class:`AsyncClient` the same method returns an
  awaitable of the same type.
- Every error answer raises :class:`ApiError` with the problem's ``code``, ``status`` and
  ``detail`` (and the whole ``problem``).
- 503 and 429 answers, and connections refused or dropped, are retried with exponential
  backoff (``Retry-After`` honoured, in seconds or as an HTTP date), up to ``retries``
  times. Job pushes are idempotent on the service (the same step again is a no-op), so
  they are retried after a lost answer too; so are GET, PATCH and DELETE.
- The bearer token comes from ``token=`` or the ``DATARAX_API_TOKEN`` environment variable.
- Arrays: numpy arrays (or anything ``np.asarray`` takes) in; ``npz=True`` sends them as
  an ``application/x-npz`` body (:func:`to_npz`); :func:`from_npz` reads npz answers.
- Background pushes: ``api.pusher(job, in_flight=2)`` sends a job's batches without
  waiting for each durable answer (:class:`Pusher`, :class:`AsyncPusher`); leaving its
  block waits for them all.
- Multi-host jobs: ``source`` and ``sources`` of a push default to
  ``jax.process_index()`` and ``jax.process_count()`` when JAX is already imported and
  the job runs on more than one process, so each host pushes its own devices' part.

Example:
  >>> from datarax.client import Client
  >>> with Client("http://127.0.0.1:8000") as api:                   # doctest: +SKIP
  ...     api.push_job_metrics("run-1", step=10, metrics={"loss": losses, "lr": 0.001})
  ...     api.get_job_metrics("run-1", max_points=1000)
"""

from __future__ import annotations

from datarax.client._clients import AsyncClient, Client
from datarax.client._core import ApiError, from_npz, history_points, jax_sources, to_npz
from datarax.client._pusher import AsyncPusher, Pusher
from datarax.client.answers import (
    AxisDetail,
    BatchLayout,
    BatchResult,
    Bucket,
    BucketMetric,
    Candidate,
    CollectAnswer,
    Collective,
    Device,
    DeviceMetrics,
    Devices,
    HardwareEntry,
    HardwareList,
    History,
    HistoryPoint,
    JobList,
    JobSummary,
    LaunchConfig,
    MemoryBudget,
    MemoryPerDevice,
    MeshPlan,
    MeshPlanList,
    MeshPlanSummary,
    MetricValue,
    ModelSpec,
    NamedModelEntry,
    NamedModelList,
    ParamLayout,
    PushResult,
    Readiness,
    Recommendations,
    ReduceAnswer,
    Session,
    SessionOptimizer,
    Shard,
    StepAnswer,
    StepBreakdown,
    StepEstimate,
    StepTiming,
)

__all__ = [
    "ApiError",
    "AsyncClient",
    "AsyncPusher",
    "AxisDetail",
    "BatchLayout",
    "BatchResult",
    "Bucket",
    "BucketMetric",
    "Candidate",
    "Client",
    "CollectAnswer",
    "Collective",
    "Device",
    "DeviceMetrics",
    "Devices",
    "HardwareEntry",
    "HardwareList",
    "History",
    "HistoryPoint",
    "JobList",
    "JobSummary",
    "LaunchConfig",
    "MemoryBudget",
    "MemoryPerDevice",
    "MeshPlan",
    "MeshPlanList",
    "MeshPlanSummary",
    "MetricValue",
    "ModelSpec",
    "NamedModelEntry",
    "NamedModelList",
    "ParamLayout",
    "PushResult",
    "Pusher",
    "Readiness",
    "Recommendations",
    "ReduceAnswer",
    "Session",
    "SessionOptimizer",
    "Shard",
    "StepAnswer",
    "StepBreakdown",
    "StepEstimate",
    "StepTiming",
    "from_npz",
    "history_points",
    "jax_sources",
    "to_npz",
]
