"""Mesh plan requests and answers."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    Tag,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict

from app.schemas.base import JsonInt, OptimizerName, OptimizerSpec, Strict
from app.schemas.hardware import (
    MODEL_DISCRIMINATOR,
    AxisName,
    BatchAxes,
    BatchDim,
    HardwarePlanRequest,
    NamedModel,
    Remat,
    TransformerModel,
)

MAX_PLAN_DEVICES = 262_144
"""Largest abstract plan (``num_devices``) and hardware plan (all the cluster's devices):
bounds the work and the size of one plan."""

MAX_MAXTEXT_KEY = 64
"""Longest MaxText key (theirs have at most ~40 characters)."""

MAX_MAXTEXT_TEXT = 256
"""Longest string value of a MaxText key (a model name, a remat policy, a dtype)."""

PLAN_REQUEST_EXAMPLE: JsonDict = {
    "axes": {"data": -1, "model": 4},
    "batch_shape": [256, 1024],
    "batch_axes": ["data"],
    "num_devices": None,
    "model": {"kind": "mlp", "features": [1024, 4096, 10]},
    "name": "llm-sweep-7",
}


class MlpModel(Strict):
    """The built-in model: a multi-layer perceptron of ``nnx.Linear`` layers (float32)."""

    kind: Literal["mlp"] = Field(description="model family; only 'mlp' is built in")
    features: list[Annotated[JsonInt, Field(ge=1, le=1_048_576)]] = Field(
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
    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        None, description="hardware plans only: parameter dtype (default bfloat16)"
    )
    remat: Remat | None = Field(None, description="hardware plans only: none or full")
    loss: Literal["mse", "cross_entropy"] | None = Field(
        None, description="hardware plans only: mse (default) or cross_entropy"
    )


PlanModel = Annotated[
    Annotated[MlpModel, Tag("mlp")]
    | Annotated[TransformerModel, Tag("transformer")]
    | Annotated[NamedModel, Tag("named")],
    MODEL_DISCRIMINATOR,
]
"""A plan's model: the built-in MLP, a transformer, or a named model."""


def _hardware_field(name: str) -> Any:
    """The hardware plan request's field ``name`` (default, bounds, description), reused as
    this model's. Typed ``Any``, as pydantic's ``Field()`` is, so it can stand as a default."""
    return HardwarePlanRequest.model_fields[name]


_PLAIN_ONLY = ("axes", "num_devices", "platform", "param_sharding")
_HARDWARE_ONLY = ("topology", "slices", "hosts", "ici", "dcn", "allow_split_physical_axes")
_HARDWARE_MLP_ONLY = ("dtype", "remat", "loss")


def _given(model: BaseModel, names: tuple[str, ...]) -> list[str]:
    """The members of ``names`` sent with a value other than their default: an explicit
    ``null`` or default (``"slices": 1``) means the same as leaving the member out, as the
    schema says."""
    fields = type(model).model_fields
    return [
        name
        for name in names
        if name in model.model_fields_set and getattr(model, name) != fields[name].default
    ]


class MeshPlanRequest(Strict):
    """A mesh plan request. Unknown fields are rejected (422 ``validation_error``)."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [PLAN_REQUEST_EXAMPLE]}
    )

    axes: dict[AxisName, JsonInt] | None = Field(
        None,
        description="ordered mapping axis name -> size; at most one size may be -1 "
        "(takes the devices the other axes leave). Required unless hardware and ici are "
        "given",
        examples=[{"data": -1, "model": 4}],
        json_schema_extra={"minProperties": 1},  # {} is 422 invalid_axis_name
    )
    batch_shape: list[BatchDim] | None = Field(
        None,
        min_length=1,
        max_length=16,
        description="global batch shape; dimension 0 is split over batch_axes. Without it "
        "the plan has no batch and every shard's index is []. Each dimension, and their "
        "product, at most 2**53 (else invalid_batch_shape)",
    )
    batch_axes: BatchAxes | None = Field(
        None,
        description="mesh axes splitting batch dimension 0, major-to-minor; default "
        "['data'] when the mesh has a 'data' axis, else [] (replicated)",
    )
    num_devices: Annotated[JsonInt, Field(ge=1, le=MAX_PLAN_DEVICES)] | None = Field(
        None,
        description="plan for a cluster of exactly this many devices without touching "
        "devices (abstract plan); absent or null: a live plan on this service's devices",
    )
    model: PlanModel | None = Field(
        None,
        description="adds parameter layouts and a per-device memory estimate; hardware "
        "plans also take a transformer and add step_estimate",
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
    # --- hardware plans (DESIGN "Contract v1.1"); see app.schemas.hardware
    hardware: str | None = Field(
        None,
        max_length=64,
        description="plan over all devices of this catalog hardware (GET /v1/hardware) in "
        "JAX's device order; then give ici (not axes or num_devices)",
    )
    topology: str | None = _hardware_field("topology")
    slices: JsonInt = _hardware_field("slices")
    hosts: JsonInt | None = _hardware_field("hosts")
    ici: dict[AxisName, JsonInt] | None = Field(
        None, description=HardwarePlanRequest.model_fields["ici"].description
    )
    dcn: dict[AxisName, JsonInt] | None = _hardware_field("dcn")
    allow_split_physical_axes: StrictBool = _hardware_field("allow_split_physical_axes")
    maxtext: dict[Annotated[str, Field(max_length=MAX_MAXTEXT_KEY)], Any] | None = Field(
        None,
        max_length=512,
        description="MaxText's own keys (ici_*_parallelism, dcn_*_parallelism, num_slices, "
        "allow_split_physical_axes, per_device_batch_size, max_target_length, model_name or "
        "the model keys, remat_policy, weight_dtype, dtype, ...) beside hardware and "
        "topology/hosts, in place of ici, dcn, model and batch_shape; the axes are then "
        "MaxText's names",
        examples=[{"ici_fsdp_parallelism": -1, "per_device_batch_size": 3,
                   "model_name": "llama3.1-8b", "max_target_length": 8192}],
    )  # fmt: skip

    @field_validator("maxtext")
    @classmethod
    def _short_maxtext_strings(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        for key, item in (value or {}).items():
            if isinstance(item, str) and len(item) > MAX_MAXTEXT_TEXT:
                raise ValueError(
                    f"maxtext[{key!r}] has {len(item)} characters; at most {MAX_MAXTEXT_TEXT}"
                )
        return value

    @model_validator(mode="after")
    def _plain_or_hardware(self) -> MeshPlanRequest:
        given = self.model_fields_set
        if self.maxtext is not None:
            if self.hardware is None:
                raise ValueError("maxtext needs hardware (and topology or hosts)")
            extra = [n for n in ("ici", "dcn", "model", "batch_shape", "batch_axes", "axes",
                                 "num_devices") if getattr(self, n) is not None]  # fmt: skip
            if extra:
                raise ValueError(
                    f"{', '.join(extra)} do not go beside maxtext: its keys say them "
                    "(ici_*/dcn_*_parallelism, the model keys, per_device_batch_size)"
                )
            return self
        if self.hardware is None:
            extra = _given(self, _HARDWARE_ONLY)
            if extra:
                raise ValueError(f"{', '.join(extra)} need hardware (a name of /v1/hardware)")
            if self.axes is None:
                raise ValueError("axes is required (or give hardware and ici)")
            if isinstance(self.model, TransformerModel | NamedModel):
                raise ValueError("a transformer model needs a hardware plan (hardware and ici)")
            if self.model is not None:
                extra = _given(self.model, _HARDWARE_MLP_ONLY)
                if extra:
                    raise ValueError(f"model.{', model.'.join(extra)} need a hardware plan")
            return self
        extra = [n for n in _PLAIN_ONLY if n in given and getattr(self, n) is not None]
        if extra:
            raise ValueError(
                f"{', '.join(extra)} do not apply to a hardware plan: its axes are the keys "
                f"of ici (sizes ici * dcn) over all the hardware's devices"
            )
        if self.ici is None:
            raise ValueError("a hardware plan needs ici, e.g. {'data': -1}")
        if isinstance(self.model, MlpModel):
            extra = _given(self.model, ("param_sharding", "optimizer"))
            if extra:
                raise ValueError(
                    f"model.{', model.'.join(extra)} do not apply to a hardware plan (axis "
                    f"roles data/fsdp/tensor shard the parameters; optimizer is top-level)"
                )
        if self.model is not None and self.batch_shape is None:
            raise ValueError("a hardware plan with a model needs batch_shape (its global batch)")
        return self


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
