"""What the service answers, as types: one :class:`~typing.TypedDict` per JSON answer.

The client returns the decoded JSON itself (plain dicts and lists); these types only
describe it, so ``answer["id"]`` and ``dict(answer)`` work as before and a type checker
knows each member. Field names are the service's, exactly (docs/API.md, DESIGN.md); a
member the service sends only sometimes is :data:`~typing.NotRequired`, one it always
sends but may leave ``null`` is ``X | None``. The keys of each type are checked against
the service's response models in tests/datarax/client/test_answers.py, so the two cannot
drift apart. Nothing here imports the service (the client must not depend on it).

Values whose shape is the caller's own (a metric's reduced value: a number, a nested
list, or null) are :data:`MetricValue`; documents the service passes through whole (a
JobSet manifest, a plan request body) stay ``dict[str, Any]``.
"""

# No ``from __future__ import annotations``: TypedDict reads NotRequired[...] at run time
# only from evaluated annotations (``__required_keys__``, which tests compare).
from typing import Any, Literal, NotRequired, TypedDict

MetricValue = Any
"""A reduced metric: a number, ``null`` (not finite) or a nested list of them, shaped by
the caller's own metric (``[n_devices]`` gives a scalar, ``[n_devices, k]`` a list)."""


# ----------------------------------------------------------------------- health, devices


class Readiness(TypedDict):
    """``GET /health/ready``."""

    status: Literal["ready"]
    runtime_pid: int | None
    runtime_restarts: int
    store: Literal["ok"]


class Device(TypedDict):
    id: int
    kind: str
    platform: str | None
    process_index: int
    coords: list[int] | None


class MemoryBudget(TypedDict):
    host: int
    device: int | None


class Devices(TypedDict):
    """``GET /v1/devices``."""

    platform: str
    process_count: int
    process_index: int
    devices: list[Device]
    memory_budget: MemoryBudget | None


# ----------------------------------------------------------------------- models, hardware


class ModelSpec(TypedDict, total=False):
    """A ``model`` as the service stores and echoes it: the MLP (``kind``, ``features``),
    a transformer (``kind: "transformer"`` and its figures) or a named model (``name``
    and the fields given beside it). Which members are there depends on the kind."""

    kind: str
    features: list[int]
    name: str
    layers: int
    d_model: int
    d_ff: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    seq_len: int
    mlp: Literal["gated", "plain"]
    dtype: str
    param_dtype: str
    remat: str
    remat_custom: dict[str, str]
    tied_embeddings: bool
    attention: Literal["flash", "dot"]
    vocab_tiling: int
    param_sharding: str
    optimizer: str | dict[str, Any]
    loss: str
    num_experts: int
    experts_per_token: int
    shared_experts: int
    moe_d_ff: int
    first_dense_layers: int
    moe_every: int
    capacity_factor: float
    moe_kernel: Literal["sparse", "dense"]
    attention_type: Literal["mha", "mla"]
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


class NamedModel(TypedDict):
    """One entry of ``GET /v1/models``: a transformer ``model`` object with its source."""

    name: str
    kind: Literal["transformer"]
    layers: int
    d_model: int
    d_ff: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    seq_len: int
    mlp: Literal["gated", "plain"]
    tied_embeddings: bool
    source: str
    notes: NotRequired[str | None]
    num_experts: NotRequired[int]
    experts_per_token: NotRequired[int]
    shared_experts: NotRequired[int]
    moe_d_ff: NotRequired[int]
    first_dense_layers: NotRequired[int]
    moe_every: NotRequired[int]
    attention_type: NotRequired[Literal["mha", "mla"]]
    q_lora_rank: NotRequired[int]
    kv_lora_rank: NotRequired[int]
    qk_nope_head_dim: NotRequired[int]
    qk_rope_head_dim: NotRequired[int]
    v_head_dim: NotRequired[int]


class NamedModelList(TypedDict):
    """``GET /v1/models``."""

    items: list[NamedModel]


class HardwareEntry(TypedDict):
    """One catalog entry of ``GET /v1/hardware``; ``sources`` says where each figure
    comes from."""

    name: str
    kind: Literal["tpu", "gpu", "cpu"]
    device_kind: str
    hbm_bytes: int
    peak_bf16_flops: float
    devices_per_host: int
    fast_domain_devices: int
    fast_link_bytes_per_s: float
    slow_link_bytes_per_s: float
    topologies: list[str]
    sources: dict[str, str]


class HardwareList(TypedDict):
    """``GET /v1/hardware``."""

    items: list[HardwareEntry]


# ------------------------------------------------------------------ plans and estimates


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


class ParamLayout(TypedDict):
    path: str
    shape: list[int]
    spec: list[str | None]
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


class LaunchConfig(TypedDict):
    """``POST /v1/meshes/{id}/launch``: ``target`` and that target's members (maxtext:
    ``args``, ``env``, ``env_sources``, ``command``; jobset: ``manifest``; slurm:
    ``script``; env: what ``jax.distributed.initialize`` needs per process, listed in
    ``processes`` up to ``process_list_limit`` processes, else given by ``rule``)."""

    target: str
    args: NotRequired[list[str] | None]
    env: NotRequired[dict[str, str] | None]
    env_sources: NotRequired[dict[str, str] | None]
    command: NotRequired[list[str] | None]
    manifest: NotRequired[dict[str, Any] | None]  # a JobSet, as Kubernetes takes it
    script: NotRequired[str | None]
    notes: list[str]
    warnings: NotRequired[list[str]]  # what will not run as it comes out (no image given)
    process_model: NotRequired[str]
    num_processes: NotRequired[int]
    coordinator_address: NotRequired[str | None]
    rule: NotRequired[dict[str, Any]]
    processes: NotRequired[list[dict[str, Any]] | None]
    process_list_limit: NotRequired[int]


# ------------------------------------------------------------------------------- metrics


class ReduceAnswer(TypedDict):
    """``POST /v1/metrics/reduce`` (JSON): each metric reduced over its devices."""

    reduced: dict[str, MetricValue]
    num_devices: int


class DeviceMetrics(TypedDict):
    device: int
    metrics: dict[str, MetricValue]


class CollectAnswer(TypedDict):
    """``POST /v1/metrics/collect``: each device's values."""

    devices: list[DeviceMetrics]


# ---------------------------------------------------------------------------------- jobs


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


class CalibrationProfile(TypedDict):
    """``GET /v1/calibrations/{id}`` and ``POST /v1/calibrations``: a profile's step-time
    constants, what they were fitted on and how well they fit."""

    id: str
    kind: Literal["published", "host", "jobs"]
    status: str
    created_at: str
    hardware: str | None
    hardware_kind: str
    device_kind: str | None
    stack: dict[str, str | None]
    constants: dict[str, Any] | None  # None while a host profile measures, or failed
    measurements: list[dict[str, Any]]
    error: dict[str, Any] | None
    progress: NotRequired[dict[str, Any] | None]  # a host profile's stages done, running
    problem: NotRequired[dict[str, Any] | None]  # why a host profile failed


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


# ------------------------------------------------------------------------------ sessions


class SessionOptimizer(TypedDict):
    name: str
    learning_rate: float


class Session(TypedDict):
    """A training session (``POST /v1/meshes/{id}/sessions``, ``GET /v1/sessions/{id}``).
    ``loss_history`` is ``[[step, loss], ...]``, every ``loss_history_stride``-th step."""

    id: str
    mesh_id: str
    created_at: str
    step: int
    last_loss: float | None
    model: ModelSpec
    optimizer: SessionOptimizer
    loss: str
    seed: int
    param_sharding: str
    strategy: str
    params: list[ParamLayout]
    loss_history: NotRequired[list[tuple[int, float | None]] | None]
    loss_history_stride: NotRequired[int | None]


class StepTiming(TypedDict):
    compile_s: float
    run_s: float
    cache_hit: bool


class StepAnswer(TypedDict):
    """``POST /v1/sessions/{id}/steps``: the losses of the steps just run (null where not
    finite)."""

    step: int
    losses: list[float | None]
    timing: StepTiming
    examples_per_s: float | None


__all__ = [
    "AxisDetail",
    "BatchLayout",
    "BatchResult",
    "Bucket",
    "BucketMetric",
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
    "JobList",
    "CalibrationProfile",
    "JobFidelity",
    "JobSummary",
    "LaunchConfig",
    "MemoryBudget",
    "MemoryPerDevice",
    "MeshPlan",
    "MeshPlanList",
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
    "MetricSpread",
]
