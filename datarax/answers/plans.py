"""Plan answers: layouts, estimates, recommendations.

Transitional: these are the client's TypedDicts, moved here to become
:class:`~datarax.answers.base.Answer` dataclasses (one definition read by the service and
the client)."""

from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

from datarax.answers.base import Answer
from datarax.answers.catalog import ModelSpec


class Shard(TypedDict):
    """One device of a plan. Hardware plans add ``slice``, ``host`` and ``physical``
    (TPU: chip coordinates, plus ``core`` where a chip has several)."""

    device: int
    process_index: int
    coords: dict[str, int]
    index: list[list[int]]
    replica: int
    slice: NotRequired[int]
    host: NotRequired[int]
    physical: NotRequired[list[int]]
    core: NotRequired[int]


class BatchLayout(TypedDict):
    shape: list[int]
    spec: list[str | list[str] | None]
    shard_shape: list[int]


@dataclass(frozen=True, eq=False)
class ParamLayout(Answer):
    """One parameter of a plan or session: its shape, spec and per-device bytes."""

    path: str
    """the parameter's path in the model's tree, ``/``-joined"""
    shape: list[int]
    spec: list[str | None]
    """the mesh axis each dimension is split over (``null``: whole)"""
    shard_shape: list[int]
    bytes_per_device: int


class MemoryPerDevice(TypedDict):
    """Bytes per device. A plan with an estimate (hardware plans with a model,
    recommendations) adds the estimate's members: ``grads``, ``activations``,
    ``hbm_bytes``, ``fits`` (null where the hardware's memory is unknown) and more."""

    params: int
    optimizer: int
    batch: int
    total: int
    grads: NotRequired[int]
    activations: NotRequired[int]
    temporaries: NotRequired[int]
    vmem: NotRequired[int | None]
    layout_copies: NotRequired[int]
    hbm_bytes: NotRequired[int | None]
    usable_hbm_bytes: NotRequired[int | None]
    host_offload_bytes: NotRequired[int]
    host_memory_bytes: NotRequired[int | None]
    fits: NotRequired[bool | None]


class AxisDetail(TypedDict):
    """A hardware plan's mesh axis: its sizes and the slowest network it crosses."""

    name: str
    size: int
    ici: int
    dcn: int
    link: Literal["ici", "nvlink", "dcn", "infiniband", "host"]
    bytes_per_s: float


class Collective(TypedDict):
    axis: str
    kind: str
    bytes_per_device: int
    link: str
    seconds: float


class StepBreakdown(TypedDict):
    matmul_s: float
    attention_s: float
    memory_bound_s: float
    exposed_comm_s: float
    offload_s: float
    overhead_s: float
    bubble_s: NotRequired[float]


class PipelineEstimate(TypedDict):
    """``step_estimate.pipeline``: the stages' schedule and its bubble."""

    stages: int
    microbatches: int
    repeats: int
    layers_per_stage: int
    schedule: Literal["gpipe", "circular", "1f1b", "interleaved_1f1b"]
    bubble_fraction: float


class StepEstimate(TypedDict):
    """A step's predicted time: ``step_s`` the calibrated wall time, ``roofline_s`` the
    ideal."""

    flops: float
    compute_s: float
    comm_s: float
    step_s: float
    roofline_s: NotRequired[float | None]
    mfu: float
    bottleneck: Literal["compute", "communication"]
    collectives: list[Collective]
    breakdown: NotRequired[StepBreakdown | None]
    gap: NotRequired[str | None]
    pipeline: NotRequired[PipelineEstimate | None]
    calibration: NotRequired[str | None]


class MeshPlan(TypedDict):
    """A stored plan (``POST /v1/meshes``, ``GET /v1/meshes/{id}``). A hardware plan adds
    ``hardware``, ``topology``, ``slices``, ``hosts``, ``ici``, ``dcn`` and
    ``axes_detail``; with a model, ``step_estimate`` and the resolved ``model``."""

    id: str
    name: str | None
    created_at: str
    live: bool
    platform: str | None
    axes: dict[str, int]
    total_devices: int
    device_grid: list[Any]  # device ids nested as deep as the mesh has axes
    batch: BatchLayout | None
    shards: list[Shard]
    params: list[ParamLayout]
    memory_per_device: MemoryPerDevice
    warnings: list[str]
    hardware: NotRequired[str]
    topology: NotRequired[str | None]
    slices: NotRequired[int]
    hosts: NotRequired[int | None]
    ici: NotRequired[dict[str, int]]
    dcn: NotRequired[dict[str, int]]
    axes_detail: NotRequired[list[AxisDetail]]
    step_estimate: NotRequired[StepEstimate]
    model: NotRequired[ModelSpec]
    context_parallel: NotRequired[dict[str, Any]]
    shard_over_data: NotRequired[bool]


class MeshPlanList(TypedDict):
    """``GET /v1/meshes``: stored plans, newest first."""

    items: list[MeshPlan]
    total: int


class Candidate(TypedDict):
    rank: int
    ici: dict[str, int]
    dcn: dict[str, int]
    step_estimate: StepEstimate
    memory_per_device: MemoryPerDevice
    plan_request: dict[str, Any]  # a POST /v1/meshes body, as it is
    flags: NotRequired[list[str]]  # tensor/expert axes across the slow network, and why


class Recommendations(TypedDict):
    """``POST /v1/recommendations``: the candidates, fastest estimated step first."""

    candidates: list[Candidate]
    considered: int
    rejected: dict[str, int]
    ranked_by: NotRequired[str | None]
    note: NotRequired[str | None]


__all__ = [
    "Shard",
    "BatchLayout",
    "ParamLayout",
    "MemoryPerDevice",
    "AxisDetail",
    "Collective",
    "StepBreakdown",
    "PipelineEstimate",
    "StepEstimate",
    "MeshPlan",
    "MeshPlanList",
    "Candidate",
    "Recommendations",
]
