"""Serving requests (DESIGN v1.4, "Serving plans"): the ``serving`` object, a serving
plan's ``POST /v1/meshes`` body and a serving ``POST /v1/recommendations`` body. The
answers are :mod:`datarax.answers.serving`; the library's own check of the options is
:class:`datarax.estimate.serving_memory.ServingOptions`."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import (
    ConfigDict,
    Discriminator,
    Field,
    RootModel,
    StrictFloat,
    Tag,
    ValidationError,
    ValidatorFunctionWrapHandler,
    model_validator,
)
from pydantic.config import JsonDict

from app.schemas.base import JsonInt, Strict, untagged
from app.schemas.hardware import (
    MODEL_DISCRIMINATOR,
    AxisName,
    HardwarePlanRequest,
    NamedModel,
    RecommendationRequest,
    TransformerModel,
)

_Tokens = Annotated[JsonInt, Field(ge=1, le=4_194_304)]

SERVING_EXAMPLE: JsonDict = {
    "input_tokens": 1000,
    "output_tokens": 1000,
    "concurrency": 64,
    "weight_dtype": "bfloat16",
    "kv_dtype": "bfloat16",
    "memory_fraction": 0.9,
    "engine": "vllm",
}

SERVING_PLAN_EXAMPLE: JsonDict = {
    "hardware": "tpu-v6e",
    "topology": "2x4",
    "ici": {"tensor": 8},
    "model": {"name": "llama3.1-70b"},
    "serving": SERVING_EXAMPLE,
}

SERVING_RECOMMENDATION_EXAMPLE: JsonDict = {
    "hardware": "tpu-v5e",
    "topology": "16x16",
    "model": {"name": "llama2-70b"},
    "serving": {"input_tokens": 1000, "output_tokens": 1000, "concurrency": 256,
                "weight_dtype": "int8"},
    "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
    "top_k": 3,
}  # fmt: skip


class ServingSpec(Strict):
    """``serving``: what the deployment serves and how (DESIGN v1.4)."""

    input_tokens: _Tokens = Field(description="mean prompt length per request")
    output_tokens: _Tokens = Field(description="mean generated length per request")
    max_batch: Annotated[JsonInt, Field(ge=1, le=1_048_576)] | None = Field(
        None,
        description="sequences a replica runs at once (vLLM max_num_seqs, MLPerf's batch); "
        "default: what the KV cache holds",
    )
    concurrency: Annotated[JsonInt, Field(ge=1, le=16_777_216)] | None = Field(
        None,
        description="clients that each keep one request in flight (a benchmark's "
        "--max-concurrency); default: every slot busy",
    )
    max_model_len: _Tokens | None = Field(
        None, description="longest sequence the engine admits; default input + output tokens"
    )
    weight_dtype: Literal["bfloat16", "float8", "int8", "int4"] = Field(
        "bfloat16", description="weights' storage dtype (with their scales)"
    )
    kv_dtype: Literal["bfloat16", "float8", "int8"] = Field(
        "bfloat16", description="KV cache dtype"
    )
    memory_fraction: Annotated[StrictFloat, Field(gt=0, le=1, allow_inf_nan=False)] = Field(
        0.9, description="share of HBM the engine may use (vLLM gpu_memory_utilization)"
    )
    engine: Literal["vllm", "jetstream", "tensorrt-llm"] = Field(
        "vllm", description="the serving engine priced"
    )


class SloSpec(Strict):
    """``slo``: the latencies a recommended layout must meet (either may be left out)."""

    ttft_s: Annotated[StrictFloat, Field(gt=0, le=86_400, allow_inf_nan=False)] | None = Field(
        None, description="mean time to first token, seconds, at most"
    )
    tpot_s: Annotated[StrictFloat, Field(gt=0, le=86_400, allow_inf_nan=False)] | None = Field(
        None, description="mean time per output token after the first, seconds, at most"
    )


ServingModel = Annotated[
    Annotated[TransformerModel, Tag("transformer")] | Annotated[NamedModel, Tag("named")],
    MODEL_DISCRIMINATOR,
]
"""A serving plan's model: a transformer or a named model (an MLP has no decode)."""

_TRAINING_ONLY: dict[str, Any] = {"remat": "none", "remat_custom": None, "vocab_tiling": 1}
"""A training step's model members, with the value that means the same as leaving them out
(a resolved model's JSON carries them)."""


def _no_training_members(model: TransformerModel | NamedModel) -> None:
    given = [
        name
        for name, default in _TRAINING_ONLY.items()
        if getattr(model, name) is not None and getattr(model, name) != default
    ]
    if model.param_dtype is not None and model.param_dtype != (model.dtype or "bfloat16"):
        given.append("param_dtype")
    if given:
        raise ValueError(
            f"model.{', model.'.join(given)} price a training step; a serving plan reads "
            "serving.weight_dtype for the weights and has no backward pass: leave them out"
        )


def _hardware(name: str) -> Any:
    return HardwarePlanRequest.model_fields[name]


class ServingPlanBody(Strict):
    """A serving plan (``POST /v1/meshes`` with ``serving``): a deployment over all the
    devices of a hardware cluster, its axes' roles ``tensor``, ``expert``, ``stage`` and
    ``data`` (independent replicas)."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [SERVING_PLAN_EXAMPLE]}
    )

    hardware: str = Field(max_length=64, description="a catalog name of GET /v1/hardware")
    topology: str | None = _hardware("topology")
    slices: JsonInt = _hardware("slices")
    hosts: JsonInt | None = _hardware("hosts")
    ici: dict[AxisName, JsonInt] = Field(
        description="ordered {axis: size} over the fast network; roles by name: tensor "
        "(model), expert, stage, data (replica, batch); one -1",
        json_schema_extra={"minProperties": 1},
    )
    dcn: dict[AxisName, JsonInt] | None = _hardware("dcn")
    allow_split_physical_axes: bool = _hardware("allow_split_physical_axes")
    model: ServingModel = Field(description="a transformer or a named model")
    serving: ServingSpec
    name: str | None = Field(None, max_length=200, description="free-form label")
    calibration: str | None = Field(
        None,
        max_length=128,
        description="a serving profile (published-<kind>-<engine>); default the hardware "
        "kind's for the engine",
    )

    @model_validator(mode="after")
    def _serving_model(self) -> Self:
        _no_training_members(self.model)
        return self


class ServingRecommendationRequest(Strict):
    """``POST /v1/recommendations`` with ``serving``: rank the cluster's tensor, expert,
    stage and replica splits by output tokens per second per device among those meeting
    ``slo``."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [SERVING_RECOMMENDATION_EXAMPLE]}
    )

    hardware: str = Field(max_length=64, description="a catalog name of GET /v1/hardware")
    topology: str | None = _hardware("topology")
    slices: JsonInt = _hardware("slices")
    hosts: JsonInt | None = _hardware("hosts")
    model: ServingModel
    serving: ServingSpec
    slo: SloSpec | None = Field(None, description="latencies each candidate must meet")
    top_k: JsonInt = Field(5, ge=1, le=100, description="candidates to return")
    calibration: str | None = Field(
        None, max_length=128, description="a serving profile (published-<kind>-<engine>)"
    )

    @model_validator(mode="after")
    def _serving_model(self) -> Self:
        _no_training_members(self.model)
        return self


def recommendation_mode(body: Any) -> str:
    """``serving`` for a body with a ``serving`` member, else ``training``."""
    if isinstance(body, ServingRecommendationRequest):
        return "serving"
    if isinstance(body, dict) and body.get("serving") is not None:
        return "serving"
    return "training"


_REC_TAGS = {("serving",), ("training",)}


class RecommendationBody(
    RootModel[
        Annotated[
            Annotated[RecommendationRequest, Tag("training")]
            | Annotated[ServingRecommendationRequest, Tag("serving")],
            Discriminator(recommendation_mode),
        ]
    ]
):
    """A ``POST /v1/recommendations`` body: a training job's (``global_batch``) or a
    serving deployment's (``serving``), told apart by ``serving``."""

    @model_validator(mode="wrap")
    @classmethod
    def _errors_without_the_tag(
        cls, data: Any, handler: ValidatorFunctionWrapHandler
    ) -> RecommendationBody:
        try:
            result: RecommendationBody = handler(data)
        except ValidationError as error:
            raise untagged(error, _REC_TAGS) from None
        return result
