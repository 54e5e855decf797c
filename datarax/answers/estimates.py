"""Estimate answers: a step's predicted time and collectives, its memory per device, the
recommendations.

Transitional: these are the client's TypedDicts, moved here to become
:class:`~datarax.answers.base.Answer` dataclasses (one definition read by the service and
the client)."""

from typing import Any, Literal, NotRequired, TypedDict


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
    "MemoryPerDevice",
    "AxisDetail",
    "Collective",
    "StepBreakdown",
    "PipelineEstimate",
    "StepEstimate",
    "Candidate",
    "Recommendations",
]
