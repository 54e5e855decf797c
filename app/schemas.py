"""Request and response models of the HTTP API (pydantic).

Requests are validated with these models. Hot responses (plans with up to hundreds of
thousands of shards, metric arrays) are serialised by hand for speed; the response models
here document them in the OpenAPI schema and describe exactly what is sent.

JSON numbers: JSON has no NaN or infinity. In requests, ``NaN``, ``Infinity`` and
``-Infinity`` literals (what Python's ``json.dumps`` writes) and ``null`` are accepted in
float metric data and read as non-finite values. In responses every non-finite float is
``null``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from datarax.distributed.metrics import NAN_POLICIES, REDUCE_OPS

MAX_PLAN_DEVICES = 262_144
"""Largest abstract plan (``num_devices``): bounds the work and the size of one plan."""

JOB_NAME_PATTERN = r"^[A-Za-z0-9._-]{1,128}$"
PLAN_ID_PATTERN = r"^m_[0-9A-HJKMNP-TV-Z]{26}$"

OIP_DATATYPES = (
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
)

PLAN_REQUEST_EXAMPLE = {
    "axes": {"data": -1, "model": 4},
    "batch_shape": [256, 1024],
    "batch_axes": ["data"],
    "num_devices": None,
    "model": {"kind": "mlp", "features": [1024, 4096, 10]},
    "name": "llm-sweep-7",
}

METRICS_REQUEST_EXAMPLE = {
    "metrics": {
        "loss": [0.9, 1.1, 1.0, 1.0],
        "accuracy": {"shape": [4], "datatype": "FP32", "data": [0.5, 0.6, 0.7, 0.8]},
        "step": [10, 10, 10, 10],
    },
    "reduce": {"loss": "mean", "accuracy": "mean", "step": "max"},
    "weights": [32, 32, 32, 16],
    "nan_policy": "propagate",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ------------------------------------------------------------------------------- plans


OptimizerName = Literal["adam", "adamw", "sgd"]


class OptimizerSpec(BaseModel):
    """An optimizer as sessions take it; plans use only ``name`` (its state size)."""

    model_config = ConfigDict(extra="allow")
    name: OptimizerName = "adam"
    learning_rate: float | None = Field(None, gt=0)


class MlpModel(_Strict):
    """The built-in model: a multi-layer perceptron of ``nnx.Linear`` layers (float32)."""

    kind: Literal["mlp"] = Field(description="model family; only 'mlp' is built in")
    features: list[Annotated[StrictInt, Field(ge=1, le=1_048_576)]] = Field(
        min_length=2,
        max_length=64,
        description="layer widths [in, hidden..., out]; layer i has kernel "
        "[features[i], features[i+1]] and bias [features[i+1]]",
        examples=[[1024, 4096, 10]],
    )
    param_sharding: Literal["replicate", "model", "fsdp"] | None = Field(
        None, description="same as the top-level field; overrides it when given"
    )
    optimizer: OptimizerName | OptimizerSpec | None = Field(
        None, description="same as the top-level field; overrides it when given"
    )


class MeshPlanRequest(_Strict):
    """A mesh plan request. Unknown fields are rejected (422 ``validation_error``)."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [PLAN_REQUEST_EXAMPLE]}
    )

    axes: dict[str, StrictInt] = Field(
        description="ordered mapping axis name -> size; at most one size may be -1 "
        "(takes the devices the other axes leave)",
        examples=[{"data": -1, "model": 4}],
    )
    batch_shape: list[Annotated[StrictInt, Field(ge=0)]] | None = Field(
        None,
        min_length=1,
        max_length=16,
        description="global batch shape; dimension 0 is split over batch_axes. Without it "
        "the plan has no batch and every shard's index is []",
    )
    batch_axes: list[str] | None = Field(
        None,
        description="mesh axes splitting batch dimension 0, major-to-minor; default "
        "['data'] when the mesh has a 'data' axis, else [] (replicated)",
    )
    num_devices: Annotated[StrictInt, Field(ge=1, le=MAX_PLAN_DEVICES)] | None = Field(
        None,
        description="plan for a cluster of exactly this many devices without touching "
        "devices (abstract plan); absent or null: a live plan on this service's devices",
    )
    model: MlpModel | None = Field(
        None, description="adds parameter layouts and a per-device memory estimate"
    )
    param_sharding: Literal["replicate", "model", "fsdp"] = Field(
        "replicate",
        description="parameter sharding rule: replicate (data parallel), model (tensor "
        "parallel over the 'model' axis) or fsdp (over the 'fsdp' axis)",
    )
    optimizer: OptimizerName | OptimizerSpec = Field(
        "adam",
        description="optimizer whose state is estimated: 'adam'/'adamw' (2x params) or "
        "'sgd' (none); a string or {'name': ...}",
    )
    name: str | None = Field(None, max_length=200, description="free-form label")
    platform: str | None = Field(
        None,
        max_length=64,
        description="abstract plans only: the platform the plan is for (e.g. 'tpu'), echoed "
        "in the answer; null otherwise. Live plans report the runtime's platform",
    )


class Shard(BaseModel):
    device: int = Field(description="device id")
    process_index: int = Field(description="JAX process holding the device")
    coords: dict[str, int] = Field(description="the device's coordinate on every mesh axis")
    index: list[list[int]] = Field(
        description="[start, stop) of every batch dimension the device holds; [] without "
        "batch_shape. Equals NamedSharding(mesh, spec).devices_indices_map(batch_shape)"
    )
    replica: int = Field(description="rank among the devices holding the same slice")


class BatchLayout(BaseModel):
    shape: list[int]
    spec: list[str | list[str] | None] = Field(
        description="PartitionSpec entries: null, an axis name, or a list of axis names "
        "(major-to-minor)"
    )
    shard_shape: list[int]


class ParamLayout(BaseModel):
    path: str = Field(examples=["layers/0/kernel"])
    shape: list[int]
    spec: list[str | None]
    shard_shape: list[int]
    bytes_per_device: int


class MemoryPerDevice(BaseModel):
    params: int = Field(description="bytes of parameters on the fullest device")
    optimizer: int = Field(description="bytes of optimizer state (adam/adamw: 2x params)")
    batch: int = Field(description="bytes of one batch shard (float32)")
    total: int


class MeshPlan(BaseModel):
    """A stored mesh plan (the answer of POST and GET ``/v1/meshes/{id}``)."""

    id: str = Field(examples=["m_01JABCDEFGHJKMNPQRSTVWXYZ0"])
    name: str | None
    created_at: str = Field(description="RFC 3339 UTC, e.g. 2026-11-30T08:00:00Z")
    live: bool = Field(description="true: planned on this service's devices")
    platform: str | None = Field(
        description="live: the runtime's platform (cpu/gpu/tpu); abstract: the request's "
        "platform or null"
    )
    axes: dict[str, int] = Field(description="resolved axis sizes, in mesh order")
    total_devices: int
    device_grid: list[Any] = Field(
        description="device ids nested like the mesh (abstract plans: 0..n-1 row-major)"
    )
    batch: BatchLayout | None
    shards: list[Shard] = Field(description="one entry per device, in mesh order")
    params: list[ParamLayout]
    memory_per_device: MemoryPerDevice = Field(
        description="bytes per device; params and optimizer are 0 without a model, batch is "
        "0 without a batch_shape"
    )
    warnings: list[str]


class MeshPlanSummary(BaseModel):
    """A stored plan without ``device_grid`` and ``shards`` (``GET /v1/meshes?view=summary``)."""

    id: str
    name: str | None
    created_at: str
    live: bool
    platform: str | None
    axes: dict[str, int]
    total_devices: int
    batch: BatchLayout | None
    params: list[ParamLayout]
    memory_per_device: MemoryPerDevice
    warnings: list[str]


class MeshPlanList(BaseModel):
    items: list[MeshPlan | MeshPlanSummary] = Field(
        description="stored plans, newest first: whole plans (view=full) or summaries "
        "without device_grid and shards (view=summary)"
    )
    total: int = Field(description="number of stored plans")


# ------------------------------------------------------------------------------ metrics


class Tensor(_Strict):
    """An Open Inference Protocol v2 style tensor: row-major flat ``data``."""

    shape: list[Annotated[StrictInt, Field(ge=0)]] = Field(examples=[[4]])
    datatype: str = Field(
        examples=["FP32"],
        description=f"one of {', '.join(OIP_DATATYPES)} (BF16 and BYTES are not supported)",
        json_schema_extra={"enum": list(OIP_DATATYPES)},
    )
    data: list[Any] = Field(description="prod(shape) values, row-major (nested lists allowed)")


MetricValue = list[Any] | Tensor

_METRICS_DESCRIPTION = (
    "name -> stacked per-device values, leading axis = devices: a nested JSON list or an "
    "OIP tensor. NaN/Infinity literals and null are read as non-finite floats"
)
_NAN_POLICY_DESCRIPTION = (
    "propagate: non-finite values flow into the result (as null); omit: ignore non-finite "
    "entries per position; raise: 422 non_finite_values"
)


class MetricsReduceRequest(_Strict):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [METRICS_REQUEST_EXAMPLE]}
    )

    metrics: dict[str, MetricValue] = Field(description=_METRICS_DESCRIPTION)
    reduce: dict[str, str] = Field(
        default_factory=dict,
        description=f"name -> operation ({', '.join(REDUCE_OPS)}); unlisted metrics use mean",
    )
    weights: list[float] | None = Field(
        None, description="[n_devices] weights making 'mean' a weighted mean"
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

    metrics: dict[str, MetricValue] = Field(description=_METRICS_DESCRIPTION)


class JobMetricsRequest(MetricsReduceRequest):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{**METRICS_REQUEST_EXAMPLE, "step": 10}]},
    )

    step: Annotated[StrictInt, Field(ge=0)] = Field(description="training step (>= 0)")


class ReduceResponse(BaseModel):
    reduced: dict[str, Any] = Field(
        description="name -> scalar (for [n_devices] input) or nested list; non-finite "
        "values are null",
        examples=[{"loss": 1.0, "per_class": [16, 20]}],
    )
    num_devices: int


class DeviceMetrics(BaseModel):
    device: int = Field(description="position on the leading (device) axis")
    metrics: dict[str, Any]


class CollectResponse(BaseModel):
    devices: list[DeviceMetrics]


class JobPointOut(BaseModel):
    step: int
    reduced: dict[str, Any]
    received_at: str = Field(description="RFC 3339 UTC")


class JobPointCreated(JobPointOut):
    job: str
    num_devices: int


class JobHistory(BaseModel):
    job: str
    points: list[JobPointOut] = Field(description="in step order")


# ------------------------------------------------------------------------ devices, health


class DeviceOut(BaseModel):
    id: int
    kind: str
    platform: str | None = None
    process_index: int
    coords: list[int] | None = Field(None, description="physical coordinates where known")


class MemoryBudget(BaseModel):
    host: int = Field(
        description="bytes sessions may plan to hold in one host's memory (its CPU devices)"
    )
    device: int | None = Field(
        description="bytes sessions may plan to hold on one accelerator; null without one"
    )


class DevicesResponse(BaseModel):
    platform: str
    process_count: int
    process_index: int
    devices: list[DeviceOut]
    memory_budget: MemoryBudget | None = Field(
        None,
        description="what training sessions are admitted against (DATARAX_MEMORY_FRACTION "
        "or DATARAX_MEMORY_BUDGET_MB); beyond it 422 insufficient_memory",
    )


class Liveness(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready"]
    runtime_pid: int | None
    runtime_restarts: int
    store: Literal["ok"]


# -------------------------------------------------------------------------------- problems


class Problem(BaseModel):
    """RFC 9457 problem details (``application/problem+json``)."""

    model_config = ConfigDict(extra="allow")
    type: str = Field(examples=["urn:datarax:problem:not_enough_devices"])
    title: str
    status: int
    detail: str
    code: str = Field(description="machine-readable snake_case reason")


class FieldError(BaseModel):
    loc: list[str | int] = Field(examples=[["body", "axes", "data"]])
    field: str = Field(examples=["axes.data"])
    msg: str
    type: str


class ValidationProblem(Problem):
    errors: list[FieldError] = Field(default_factory=list)


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for the given problem statuses."""
    descriptions = {
        401: "missing or wrong bearer token (code unauthorized)",
        404: "not found",
        409: "conflict",
        413: "request body too large (payload_too_large)",
        415: "body is neither JSON nor application/x-npz (unsupported_media_type)",
        422: "validation_error, invalid_json or a domain code",
        503: "device runtime unavailable (worker_lost) or starting (not_ready)",
        504: "device command timed out (step_timeout)",
    }
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        name = "ValidationProblem" if status == 422 else "Problem"
        out[status] = {
            "description": descriptions.get(status, "error"),
            "content": {
                "application/problem+json": {"schema": {"$ref": f"#/components/schemas/{name}"}}
            },
        }
    return out


# ------------------------------------------------------------------------------ sessions

SESSION_REQUEST_EXAMPLE: dict[str, Any] = {
    "model": {"kind": "mlp", "features": [16, 64, 4]},
    "optimizer": {"name": "adam", "learning_rate": 0.01},
    "loss": "mse",
    "seed": 0,
    "param_sharding": "replicate",
    "strategy": "spmd",
}

STEP_REQUEST_EXAMPLE: dict[str, Any] = {"steps": 10, "synthetic": {"seed": 0, "batch_size": 64}}


class SessionModel(_Strict):
    """The built-in MLP a session trains."""

    kind: Literal["mlp"] = Field(description="model family; only 'mlp' is built in")
    features: list[Annotated[StrictInt, Field(ge=1, le=65_536)]] = Field(
        min_length=2, max_length=32, description="layer widths [in, hidden..., out]"
    )


class SessionOptimizer(_Strict):
    name: OptimizerName = "adam"
    learning_rate: float = Field(1e-3, gt=0, le=10)


class SessionCreateRequest(_Strict):
    model: SessionModel
    optimizer: SessionOptimizer = Field(default_factory=SessionOptimizer)
    loss: Literal["mse", "cross_entropy"] = Field(
        "mse", description="mse: float targets [B, out]; cross_entropy: integer ids [B]"
    )
    seed: StrictInt = Field(0, ge=0, le=2**31 - 1, description="parameter initialisation")
    param_sharding: Literal["replicate", "model", "fsdp"] = "replicate"
    strategy: Literal["spmd", "collective"] = Field(
        "spmd",
        description="spmd: nnx.jit under the mesh (XLA all-reduces); collective: the "
        "guide's pmap path, explicit gradient pmean (needs param_sharding=replicate)",
    )


class SyntheticBatch(_Strict):
    seed: StrictInt = Field(0, ge=0, le=2**31 - 1)
    batch_size: StrictInt = Field(ge=1, le=1_048_576)


class StepBatch(_Strict):
    inputs: list[Any] | Tensor = Field(description="[B, features[0]] numbers")
    targets: list[Any] | Tensor | None = Field(
        None, description="[B, features[-1]] floats (mse) or [B] class ids (cross_entropy)"
    )


class StepRequest(_Strict):
    steps: StrictInt = Field(1, description="training steps to run (1..max_steps_per_call)")
    batch: StepBatch | None = Field(None, description="the same batch for every step")
    synthetic: SyntheticBatch | None = Field(
        None,
        description="one generated batch per step number; depends only on seed, "
        "batch size, model and step number",
    )


class StepTiming(BaseModel):
    compile_s: float
    run_s: float
    cache_hit: bool


class StepResponse(BaseModel):
    step: int
    losses: list[float]
    timing: StepTiming
    examples_per_s: float | None


class SessionOut(BaseModel):
    id: str
    mesh_id: str
    created_at: str
    step: int
    last_loss: float | None = None
    model: SessionModel
    optimizer: SessionOptimizer
    loss: str
    seed: int
    param_sharding: str
    strategy: str
    params: list[ParamLayout]
