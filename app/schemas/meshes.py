"""Mesh plan requests (the answers are :mod:`datarax.answers.plans`)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    RootModel,
    Tag,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict

from app.schemas.base import (
    JsonInt,
    OptimizerName,
    OptimizerSpec,
    Strict,
    optimizer_name,
    shards_over_data,
    untagged,
)
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
from app.schemas.serving import ServingPlanBody

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

    @field_validator("optimizer")
    @classmethod
    def _optimizer_as_plans_read_it(cls, value: Any) -> Any:
        return _plan_optimizer(value, zero1=None)


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


# Members of other modes that a mode takes at one value, meaning the same as leaving them
# out (the body of v1.0 was one object, so clients send them): {name: that value}.
_HARDWARE_ONLY: dict[str, Any] = {
    "topology": None,
    "slices": 1,
    "hosts": None,
    "ici": None,
    "dcn": None,
    "allow_split_physical_axes": False,
}
_PLAIN_TOLERATED = {"hardware": None, "maxtext": None, **_HARDWARE_ONLY}
_LIVE_TOLERATED = {**_PLAIN_TOLERATED, "num_devices": None, "platform": None}
_PLAIN_ONLY = ("axes", "num_devices", "platform", "param_sharding")
_HARDWARE_TOLERATED = {"maxtext": None, "axes": None, "num_devices": None, "platform": None}
_NOT_BESIDE_MAXTEXT = ("ici", "dcn", "model", "batch_shape", "batch_axes", "axes", "num_devices")
# Members a MaxText-mode body took since v1.1 without effect (its keys say them): taken at
# their default, which means the same as leaving them out, and refused at any other value
# (DESIGN v1.4, "Every input is used or refused"), each with what says it instead.
_SAID_BY_MAXTEXT: dict[str, tuple[Any, str]] = {
    "platform": (None, "the hardware's kind is the platform"),
    "param_sharding": (
        "replicate",
        "the axes shard the parameters (maxtext's ici_*/dcn_*_parallelism keys)",
    ),
    "allow_split_physical_axes": (False, "give maxtext's own allow_split_physical_axes key"),
}
_MAXTEXT_TOLERATED: dict[str, Any] = {
    **dict.fromkeys(_NOT_BESIDE_MAXTEXT),
    **{name: default for name, (default, _) in _SAID_BY_MAXTEXT.items()},
}
_HARDWARE_MLP_ONLY = ("dtype", "remat", "loss")


def _at_default(value: Any, default: Any) -> bool:
    """Whether ``value`` is ``default`` as JSON compares them (``1.0`` is ``1``, ``true``
    is not)."""
    if default is None or isinstance(default, bool):
        return value is default
    return value == default and not isinstance(value, bool)


def _foreign(data: dict[str, Any], names: Iterable[str], tolerated: dict[str, Any]) -> list[str]:
    """The members of ``names`` sent with a value that counts: other than the one
    ``tolerated`` takes as leaving them out."""
    return [
        name
        for name in names
        if name in data and not (name in tolerated and _at_default(data[name], tolerated[name]))
    ]


def _without_tolerated(data: dict[str, Any], tolerated: dict[str, Any]) -> dict[str, Any]:
    """``data`` without the ``tolerated`` members sent at their value (a copy: the caller's
    body stays as sent); any other value stays, for the model to refuse."""
    return {
        key: value
        for key, value in data.items()
        if not (key in tolerated and _at_default(value, tolerated[key]))
    }


def _tolerating(tolerated: dict[str, Any]) -> Any:
    """A ``json_schema_extra`` that documents the ``tolerated`` members: the schema says
    what the server accepts, no more and no less."""

    def extra(schema: JsonDict) -> None:
        properties = schema.setdefault("properties", {})
        assert isinstance(properties, dict)
        for name, value in tolerated.items():
            kind: JsonDict = {"type": "null"} if value is None else {"const": value}
            properties[name] = {**kind, "description": "the same as leaving it out"}

    return extra


def _unread(body: Any) -> list[str]:
    """The members of a plan body sent with a value that nothing reads (DESIGN v1.4,
    "Every input is used or refused"): without a model its optimizer (and
    ``param_sharding``, ``calibration``: they lay out, size and price a model's
    parameters). (``batch_axes`` without ``batch_shape`` is checked by the planner, which
    refuses an axis the mesh lacks: ``unknown_batch_axis``.)"""
    unread = []
    if body.model is None:
        if optimizer_name(body.optimizer) != "adam" or shards_over_data(body.optimizer):
            unread.append("optimizer (it sizes a model's optimizer state; no model is given)")
        if getattr(body, "param_sharding", "replicate") != "replicate":
            unread.append("param_sharding (it lays out a model's parameters; no model is given)")
        if getattr(body, "calibration", None) is not None:
            unread.append("calibration (it prices a model's step; no model is given)")
    return unread


def _given(model: BaseModel, names: tuple[str, ...]) -> list[str]:
    """The members of ``names`` sent with a value other than their default: an explicit
    ``null`` or default means the same as leaving the member out, as the schema says."""
    fields = type(model).model_fields
    return [
        name
        for name in names
        if name in model.model_fields_set and getattr(model, name) != fields[name].default
    ]


def _plan_optimizer(value: Any, *, zero1: str | None) -> Any:
    """A plan's ``optimizer`` as plans read it: its name, and ``shard_over_data`` where
    ``zero1`` says how the plan reads it (``None``: the plan does not, and refuses it).
    The members that change no plan (``learning_rate``, the optimizer's other members,
    which sessions read) are accepted, as the optimizer takes one form everywhere (DESIGN
    v1.2), and named in the plan's ``warnings``
    (:func:`app.schemas.base.unread_optimizer_notes`)."""
    if not isinstance(value, OptimizerSpec):
        return value
    if value.shard_over_data and zero1 is None:
        raise ValueError(
            "optimizer.shard_over_data applies to hardware plans (hardware and ici), whose "
            "axes have roles; leave it out here"
        )
    return value


class _PlainPlanBody(Strict):
    """The members live and abstract plans share (plans over ``axes``)."""

    axes: dict[AxisName, JsonInt] = Field(
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

    @model_validator(mode="before")
    @classmethod
    def _no_hardware_members(cls, data: Any) -> Any:
        # The members of other modes sent at their default mean nothing; any other value
        # is refused with what would make it count.
        if not isinstance(data, dict):
            return data
        # a live plan takes num_devices: null (an abstract plan's is required)
        tolerated = _PLAIN_TOLERATED if "num_devices" in cls.model_fields else _LIVE_TOLERATED
        extra = _foreign(data, _HARDWARE_ONLY, tolerated)
        if extra:
            raise ValueError(f"{', '.join(extra)} need hardware (a name of /v1/hardware)")
        if "num_devices" not in cls.model_fields and data.get("platform") is not None:
            raise ValueError(
                "platform applies to abstract plans (with num_devices): a live plan's "
                "platform is the runtime's (GET /v1/devices); leave it out"
            )
        data = _without_tolerated(data, tolerated)
        if data.get("axes") is None:
            raise ValueError("axes is required (or give hardware and ici)")
        return data

    @field_validator("optimizer")
    @classmethod
    def _optimizer_as_plans_read_it(cls, value: Any) -> Any:
        return _plan_optimizer(value, zero1=None)

    @model_validator(mode="after")
    def _mlp_only(self) -> Self:
        unread = _unread(self)
        if unread:
            raise ValueError(f"{'; '.join(unread)} would change nothing: leave it out")
        if isinstance(self.model, TransformerModel | NamedModel):
            raise ValueError("a transformer model needs a hardware plan (hardware and ici)")
        if self.model is not None:
            extra = _given(self.model, _HARDWARE_MLP_ONLY)
            if extra:
                raise ValueError(f"model.{', model.'.join(extra)} need a hardware plan")
            # the model's member overrides the top-level one, which then says nothing
            twice = [
                name
                for name in ("param_sharding", "optimizer")
                if getattr(self.model, name) is not None and name in _given(self, (name,))
            ]
            if twice:
                raise ValueError(
                    f"{', '.join(twice)} given twice, at the top level and in model (whose "
                    f"value overrides the other, which would change nothing): give it once"
                )
        return self

    @property
    def mlp(self) -> MlpModel | None:
        """The plan's model: an MLP or none (the validator refuses the others)."""
        return self.model if isinstance(self.model, MlpModel) else None


class LivePlanBody(_PlainPlanBody):
    """A live plan (no ``num_devices``): a mesh of this service's devices."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_tolerating(_LIVE_TOLERATED))


class AbstractPlanBody(_PlainPlanBody):
    """An abstract plan: ``num_devices`` devices numbered ``0..n-1``, none touched."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_tolerating(_PLAIN_TOLERATED))

    num_devices: Annotated[JsonInt, Field(ge=1, le=MAX_PLAN_DEVICES)] = Field(
        description="plan for a cluster of exactly this many devices without touching "
        "devices (abstract plan); absent or null: a live plan on this service's devices",
    )
    platform: str | None = Field(
        None,
        max_length=64,
        description="the platform the plan is for (e.g. 'tpu'), echoed in the answer. A "
        "live plan reports the runtime's platform and refuses one given",
    )


PlainPlanBody = LivePlanBody | AbstractPlanBody
"""A plan over ``axes``: live or abstract."""


class HardwarePlanBody(HardwarePlanRequest):
    """A hardware plan: all the devices of a catalog cluster, in JAX's device order for
    it (DESIGN "Contract v1.1"; see :mod:`app.schemas.hardware`)."""

    # The service's HardwarePlanRequest as it arrives over HTTP, nothing copied: the
    # request's fields (those not redeclared here are its own), the members of other
    # modes tolerated at their default, the plain plans' MLP as its model, and the checks
    # across members below. (The docstring is the OpenAPI description, so this is not.)

    model_config = ConfigDict(extra="forbid", json_schema_extra=_tolerating(_HARDWARE_TOLERATED))

    hardware: str = Field(
        max_length=64,
        description="plan over all devices of this catalog hardware (GET /v1/hardware) in "
        "JAX's device order; then give ici (not axes or num_devices)",
    )
    batch_shape: list[BatchDim] | None = Field(
        None,
        min_length=1,
        max_length=16,
        description="global batch shape; dimension 0 is split over batch_axes (default: "
        "the axes whose role is data or fsdp). Needed with a model",
    )
    # The plain plans' MLP (param_sharding and optimizer refused non-null below): its
    # JSON is the hardware MLP's, which is all the services read of it.
    model: PlanModel | None = Field(  # type: ignore[assignment]
        None, description="adds step_estimate and memory_per_device (needs batch_shape)"
    )
    optimizer: OptimizerName | OptimizerSpec = Field(
        "adam", description="optimizer whose state is estimated"
    )
    name: str | None = Field(None, max_length=200, description="free-form label")

    @model_validator(mode="before")
    @classmethod
    def _no_plain_members(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        extra = _foreign(data, _PLAIN_ONLY, _HARDWARE_TOLERATED)
        if extra:
            raise ValueError(
                f"{', '.join(extra)} do not apply to a hardware plan: its axes are the keys "
                f"of ici (sizes ici * dcn) over all the hardware's devices"
            )
        data = _without_tolerated(data, _HARDWARE_TOLERATED)
        if data.get("ici") is None:
            raise ValueError("a hardware plan needs ici, e.g. {'data': -1}")
        return data

    @field_validator("optimizer")
    @classmethod
    def _optimizer_as_plans_read_it(cls, value: Any) -> Any:
        return _plan_optimizer(value, zero1="hardware")

    @model_validator(mode="after")
    def _model_as_hardware_plans_take_it(self) -> Self:
        unread = _unread(self)
        if unread:
            raise ValueError(f"{'; '.join(unread)} would change nothing: leave it out")
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


class MaxTextPlanBody(Strict):
    """A hardware plan from MaxText's own keys (``maxtext``) beside ``hardware``."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_tolerating(_MAXTEXT_TOLERATED))

    hardware: str = Field(
        max_length=64, description="a catalog name of GET /v1/hardware (needed with maxtext)"
    )
    topology: str | None = _hardware_field("topology")
    slices: JsonInt = _hardware_field("slices")
    hosts: JsonInt | None = _hardware_field("hosts")
    maxtext: dict[Annotated[str, Field(max_length=MAX_MAXTEXT_KEY)], Any] = Field(
        max_length=512,
        description="MaxText's own keys (ici_*_parallelism, dcn_*_parallelism, num_slices, "
        "allow_split_physical_axes, per_device_batch_size, max_target_length, model_name or "
        "the model keys, remat_policy, weight_dtype, dtype, ...) beside hardware and "
        "topology/hosts, in place of ici, dcn, model and batch_shape; the axes are then "
        "MaxText's names",
        examples=[{"ici_fsdp_parallelism": -1, "per_device_batch_size": 3,
                   "model_name": "llama3.1-8b", "max_target_length": 8192}],
    )  # fmt: skip
    optimizer: OptimizerName | OptimizerSpec = Field(
        "adam", description="overrides maxtext's opt_type when given"
    )
    name: str | None = Field(None, max_length=200, description="free-form label")
    calibration: str | None = Field(
        None,
        max_length=128,
        description=HardwarePlanRequest.model_fields["calibration"].description,
    )

    @model_validator(mode="before")
    @classmethod
    def _only_maxtext_says_the_plan(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if data.get("hardware") is None:
            raise ValueError("maxtext needs hardware (and topology or hosts)")
        extra = _foreign(data, _NOT_BESIDE_MAXTEXT, _MAXTEXT_TOLERATED)
        if extra:
            raise ValueError(
                f"{', '.join(extra)} do not go beside maxtext: its keys say them "
                "(ici_*/dcn_*_parallelism, the model keys, per_device_batch_size)"
            )
        for name in _foreign(data, _SAID_BY_MAXTEXT, _MAXTEXT_TOLERATED):
            default, instead = _SAID_BY_MAXTEXT[name]
            sent = json.dumps(data[name], default=str)
            raise ValueError(
                f"{name} {sent} would change nothing beside maxtext: {instead}; leave "
                f"{name} out (or {json.dumps(default)})"
            )
        return _without_tolerated(data, _MAXTEXT_TOLERATED)

    @field_validator("optimizer")
    @classmethod
    def _optimizer_as_plans_read_it(cls, value: Any) -> Any:
        return _plan_optimizer(value, zero1="maxtext")

    @field_validator("maxtext")
    @classmethod
    def _short_maxtext_strings(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key, item in value.items():
            if isinstance(item, str) and len(item) > MAX_MAXTEXT_TEXT:
                raise ValueError(
                    f"maxtext[{key!r}] has {len(item)} characters; at most {MAX_MAXTEXT_TEXT}"
                )
        return value


_MODE_OF: dict[type[BaseModel], str] = {
    LivePlanBody: "live",
    AbstractPlanBody: "abstract",
    HardwarePlanBody: "hardware",
    MaxTextPlanBody: "maxtext",
    ServingPlanBody: "serving",
}


_TAGS = {(tag,) for tag in _MODE_OF.values()}


def plan_mode(body: Any) -> str:
    """The mode of a ``POST /v1/meshes`` body, from the members it sends (it has no tag):
    ``serving`` with a serving object, else ``maxtext`` with MaxText's keys, else
    ``hardware`` with a hardware name, else ``abstract`` with ``num_devices``, else
    ``live``. ``null`` counts as absent. A body that is not an object is taken as live,
    whose model then refuses it."""
    if isinstance(body, BaseModel):
        return _MODE_OF.get(type(body), "live")
    if not isinstance(body, dict):
        return "live"
    if body.get("serving") is not None:
        return "serving"
    if body.get("maxtext") is not None:
        return "maxtext"
    if body.get("hardware") is not None:
        return "hardware"
    return "abstract" if body.get("num_devices") is not None else "live"


PlanBody = Annotated[
    Annotated[LivePlanBody, Tag("live")]
    | Annotated[AbstractPlanBody, Tag("abstract")]
    | Annotated[HardwarePlanBody, Tag("hardware")]
    | Annotated[MaxTextPlanBody, Tag("maxtext")]
    | Annotated[ServingPlanBody, Tag("serving")],
    Discriminator(plan_mode),
]
"""A ``POST /v1/meshes`` body as its mode's type (:func:`plan_mode` tells them apart)."""


def _untagged(error: ValidationError) -> ValidationError:
    """``error`` with the mode's tag taken out of every location: the body has no tag, so
    ``axes.data`` names the member sent, as before the modes had types."""
    return untagged(error, _TAGS)


class MeshPlanRequest(RootModel[PlanBody]):
    """A mesh plan request: one of four modes, told apart by the members sent (live:
    ``axes``; abstract: ``axes`` and ``num_devices``; hardware: ``hardware`` and ``ici``;
    MaxText: ``hardware`` and ``maxtext``). Unknown members, and members of another mode,
    are refused (422 ``validation_error``)."""

    # ``root`` is the mode's typed request: what the services take.
    model_config = ConfigDict(json_schema_extra={"examples": [PLAN_REQUEST_EXAMPLE]})

    @model_validator(mode="wrap")
    @classmethod
    def _errors_without_the_tag(
        cls, data: Any, handler: ValidatorFunctionWrapHandler
    ) -> MeshPlanRequest:
        try:
            result: MeshPlanRequest = handler(data)
        except ValidationError as error:
            raise _untagged(error) from None
        return result
