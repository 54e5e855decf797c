"""What the service answers, as types: the answer classes of :mod:`datarax.answers`,
re-exported for the client (one definition, read by the service and the client).

The client parses each JSON answer into its class (:meth:`~datarax.answers.base.Answer.from_json`):
attributes are the typed read, and an answer is also a read-only mapping of the members its
JSON has, so ``answer["id"]`` and ``dict(answer)`` work as they did when the client returned
dicts. Values whose shape is the caller's own (a metric's reduced value) are
:data:`MetricValue`; documents the service passes through whole (a JobSet manifest, a plan
request body) stay ``dict[str, Any]``.
"""

from datarax.answers.calibrations import CalibrationProfile
from datarax.answers.catalog import (
    HardwareEntry,
    HardwareList,
    ModelSpec,
    NamedModel,
    NamedModelList,
)
from datarax.answers.estimates import (
    AxisDetail,
    Candidate,
    Collective,
    MemoryPerDevice,
    PipelineEstimate,
    Recommendations,
    StepBreakdown,
    StepEstimate,
)
from datarax.answers.health import Device, Devices, Liveness, MemoryBudget, Readiness
from datarax.answers.jobs import (
    BatchResult,
    Bucket,
    BucketMetric,
    History,
    HistoryPoint,
    JobFidelity,
    JobList,
    JobSummary,
    MetricSpread,
    PushResult,
)
from datarax.answers.launch import LaunchConfig
from datarax.answers.metrics import CollectAnswer, DeviceMetrics, MetricValue, ReduceAnswer
from datarax.answers.plans import BatchLayout, MeshPlan, MeshPlanList, ParamLayout, Shard
from datarax.answers.sessions import Session, SessionOptimizer, StepAnswer, StepTiming

__all__ = [
    "AxisDetail",
    "BatchLayout",
    "BatchResult",
    "Bucket",
    "BucketMetric",
    "CalibrationProfile",
    "Candidate",
    "CollectAnswer",
    "Collective",
    "Device",
    "DeviceMetrics",
    "Devices",
    "HardwareEntry",
    "HardwareList",
    "History",
    "HistoryPoint",
    "JobFidelity",
    "JobList",
    "JobSummary",
    "LaunchConfig",
    "Liveness",
    "MemoryBudget",
    "MemoryPerDevice",
    "MeshPlan",
    "MeshPlanList",
    "MetricSpread",
    "MetricValue",
    "ModelSpec",
    "NamedModel",
    "NamedModelList",
    "ParamLayout",
    "PipelineEstimate",
    "PushResult",
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
]
