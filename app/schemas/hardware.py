"""Hardware plan requests and recommendation requests, with the ``model`` objects they
take.

Field names follow the contract's v1.1 additions (docs/API.md). This module imports only
:mod:`app.schemas.base`; :mod:`app.schemas.meshes` builds on it (a ``POST /v1/meshes`` body
may carry the hardware fields). The answers (catalog entries, step estimates,
recommendations) are :mod:`datarax.answers.catalog` and :mod:`datarax.answers.estimates`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, StrictBool, StrictFloat, Tag
from pydantic.config import JsonDict

from app.schemas.base import JsonInt, OptimizerField, Strict
from datarax.plan.layout import MAX_AXIS_NAME_LENGTH, MAX_BATCH_ELEMENTS

AxisName = Annotated[str, Field(min_length=1, max_length=MAX_AXIS_NAME_LENGTH)]
"""A mesh axis name: at most 64 characters (every device's ``coords`` repeats it, so a
plan grows with its names' length; the planner also wants a Python identifier)."""

BatchDim = Annotated[JsonInt, Field(ge=0, le=MAX_BATCH_ELEMENTS)]
"""One batch dimension: 0 to 2**53 (exact in int64 and in a JSON double); the planner
also refuses shapes whose product passes 2**53 (``invalid_batch_shape``)."""

BatchAxes = Annotated[list[AxisName], Field(max_length=64)]

ModelDtype = Literal["float32", "bfloat16", "float16"]
Remat = Literal["none", "full"]
MaxTextRemat = Literal[
    "none",
    "minimal",
    "minimal_with_context",
    "save_dot_with_context_except_mlp",
    "save_dot_except_mlpwi",
    "save_dot_except_mlp",
    "save_qkv_proj",
    "qkv_proj_offloaded",
    "minimal_offloaded",
    "save_out_proj",
    "full",
    "custom",
]
RematTensor = Literal[
    "decoder_layer_input",
    "context",
    "mlpwi",
    "mlpwi_0",
    "mlpwi_1",
    "mlpwo",
    "query_proj",
    "key_proj",
    "value_proj",
    "qkv_proj",
    "out_proj",
]
RematPlace = Literal["device", "offload", "remat"]

HARDWARE_PLAN_EXAMPLE: JsonDict = {
    "hardware": "tpu-v5e",
    "topology": "16x16",
    "slices": 2,
    "ici": {"data": 1, "fsdp": -1, "tensor": 4},
    "dcn": {"data": -1},
    "batch_shape": [1024, 2048],
    "batch_axes": ["data", "fsdp"],
}

RECOMMENDATION_EXAMPLE: JsonDict = {
    "hardware": "tpu-v5e",
    "topology": "4x4",
    "slices": 2,
    "model": {
        "kind": "transformer",
        "layers": 4,
        "d_model": 1024,
        "d_ff": 4096,
        "heads": 8,
        "kv_heads": 8,
        "vocab": 32000,
        "seq_len": 2048,
    },
    "global_batch": 64,
    "top_k": 3,
    "axes": ["data", "fsdp", "tensor"],
}

_Size = Annotated[JsonInt, Field(ge=1, le=1_048_576)]
# Plans and recommendations walk the parameters layer by layer: 1,048,575 layers took 48 s
# of one request (schemathesis); the deepest published models have a few hundred.
MAX_LAYERS = 4096


class HardwareMlpModel(Strict):
    """The MLP as hardware plans and recommendations take it (dtype default bfloat16)."""

    kind: Literal["mlp"]
    features: list[_Size] = Field(min_length=2, max_length=64, examples=[[1024, 4096, 10]])
    dtype: ModelDtype | None = Field(None, description="default bfloat16")
    remat: Remat | None = Field(None, description="none (default) or full")
    loss: Literal["mse", "cross_entropy"] | None = Field(None, description="default mse")


class _TransformerFields(Strict):
    """The transformer's optional fields (DESIGN v1.2), MaxText's semantics."""

    mlp: Literal["gated", "plain"] | None = Field(None, description="gated (default) or plain")
    dtype: ModelDtype | None = Field(None, description="compute dtype (default bfloat16)")
    param_dtype: ModelDtype | None = Field(
        None, description="parameters and optimizer moments (MaxText weight_dtype); default dtype"
    )
    remat: MaxTextRemat | None = Field(None, description="MaxText's remat_policy (default none)")
    remat_custom: dict[RematTensor, RematPlace] | None = Field(
        None,
        description="remat custom only: MaxText tensor name -> device, offload or remat "
        "(unlisted: remat; decoder_layer_input: device)",
    )
    head_dim: Annotated[JsonInt, Field(ge=1, le=65_536)] | None = Field(
        None, description="default d_model // heads"
    )
    tied_embeddings: StrictBool | None = Field(None, description="default false")
    attention: Literal["flash", "dot"] | None = Field(
        None, description="flash (fused kernel, default) or dot (materialized scores)"
    )
    vocab_tiling: Annotated[JsonInt, Field(ge=1, le=4096)] | None = Field(
        None, description="MaxText num_vocab_tiling (default 1)"
    )
    num_experts: Annotated[JsonInt, Field(ge=0, le=65_536)] | None = Field(
        None, description="routed experts per MoE layer (MaxText num_experts); 0 or 1: dense"
    )
    experts_per_token: Annotated[JsonInt, Field(ge=1, le=65_536)] | None = Field(
        None, description="MaxText num_experts_per_tok (default 1)"
    )
    shared_experts: Annotated[JsonInt, Field(ge=0, le=1024)] | None = Field(
        None, description="experts every token goes through (MaxText shared_experts)"
    )
    moe_d_ff: _Size | None = Field(
        None, description="one expert's hidden width (MaxText base_moe_mlp_dim; default d_ff)"
    )
    first_dense_layers: Annotated[JsonInt, Field(ge=0, le=MAX_LAYERS)] | None = Field(
        None, description="leading dense layers (MaxText first_num_dense_layers)"
    )
    moe_every: Annotated[JsonInt, Field(ge=1, le=MAX_LAYERS)] | None = Field(
        None, description="MaxText interleave_moe_layer_step (default 1: every layer)"
    )
    capacity_factor: (
        Annotated[StrictFloat, Field(ge=-1.0, le=1024.0, allow_inf_nan=False)] | None
    ) = Field(None, description="MaxText capacity_factor; 0 or less: dropless (default -1)")
    moe_kernel: Literal["sparse", "dense"] | None = Field(
        None, description="sparse (grouped matmul, default) or dense (capacity-padded einsum)"
    )
    attention_type: Literal["mha", "mla"] | None = Field(
        None, description="mha (default, grouped by kv_heads) or mla (multi-head latent)"
    )
    q_lora_rank: Annotated[JsonInt, Field(ge=0, le=1_048_576)] | None = Field(
        None, description="mla: query bottleneck rank (0: none)"
    )
    kv_lora_rank: _Size | None = Field(None, description="mla: key/value bottleneck rank")
    qk_nope_head_dim: _Size | None = Field(None, description="mla: query/key width without rope")
    qk_rope_head_dim: _Size | None = Field(None, description="mla: query/key rotary width")
    v_head_dim: _Size | None = Field(None, description="mla: value head width")


class TransformerModel(_TransformerFields):
    """A decoder-only transformer (no biases; gated MLP unless ``mlp: plain``)."""

    kind: Literal["transformer"]
    layers: Annotated[JsonInt, Field(ge=1, le=MAX_LAYERS)]
    d_model: _Size
    d_ff: _Size
    heads: _Size
    kv_heads: _Size
    vocab: _Size
    seq_len: _Size


class NamedModel(_TransformerFields):
    """A named model of ``GET /v1/models``; the other fields override the entry's."""

    name: str = Field(max_length=64, examples=["llama3.1-8b"])
    kind: Literal["transformer"] | None = None
    layers: Annotated[JsonInt, Field(ge=1, le=MAX_LAYERS)] | None = None
    d_model: _Size | None = None
    d_ff: _Size | None = None
    heads: _Size | None = None
    kv_heads: _Size | None = None
    vocab: _Size | None = None
    seq_len: _Size | None = None


def model_tag(value: Any) -> str | None:
    if isinstance(value, dict):
        return "named" if "name" in value else value.get("kind")
    if isinstance(value, NamedModel):
        return "named"
    return getattr(value, "kind", None)


MODEL_DISCRIMINATOR = Discriminator(
    model_tag,
    custom_error_type="invalid_model",
    custom_error_message="model needs a kind ('mlp' or 'transformer') or a name",
)
"""Tells the members of a ``model`` field apart by ``kind`` or ``name`` (:func:`model_tag`).
Each request spells its union out (an MLP of its own, a transformer, a named model) so
that the type checker sees the classes, not a type built at run time."""

HardwareModel = Annotated[
    Annotated[HardwareMlpModel, Tag("mlp")]
    | Annotated[TransformerModel, Tag("transformer")]
    | Annotated[NamedModel, Tag("named")],
    MODEL_DISCRIMINATOR,
]
"""A hardware plan's model: an MLP, a transformer, or a named model."""

_HARDWARE = Field(max_length=64, description="a catalog name of GET /v1/hardware")
_TOPOLOGY = Field(
    None,
    max_length=64,
    description="TPU only: slice shape, '16x16', JAX's 'v5e:16x16' or a Cloud TPU "
    "accelerator type, 'v5p-512' (the answer's topology gives the resolved shape)",
)
_SLICES = Field(1, ge=1, le=65_536, description="TPU only: slices joined by DCN")
_HOSTS = Field(None, ge=1, le=65_536, description="GPU/CPU only: hosts in the job")
_SPLIT = Field(False, description="as in jax.experimental.mesh_utils.create_device_mesh")
_CALIBRATION = Field(
    None,
    max_length=128,
    description="the calibration profile pricing step times (GET /v1/calibrations); "
    "default: the hardware kind's jax profile, named in step_estimate.calibration",
)


class PipelineSpec(Strict):
    """``pipeline`` (DESIGN v1.3): the schedule of the ``stage`` axes."""

    microbatches: Annotated[JsonInt, Field(ge=1, le=1_048_576)] | None = Field(
        None, description="microbatches a step (MaxText num_pipeline_microbatches); default "
        "the stages"
    )  # fmt: skip
    layers_per_stage: Annotated[JsonInt, Field(ge=1, le=MAX_LAYERS)] | None = Field(
        None, description="layers a stage runs per pass (MaxText num_layers_per_pipeline_stage);"
        " default layers / stages, one repeat"
    )  # fmt: skip
    schedule: Literal["gpipe", "circular", "1f1b", "interleaved_1f1b"] = Field(
        "gpipe", description="gpipe (default), circular (MaxText's), 1f1b, interleaved_1f1b"
    )


class ContextParallelSpec(Strict):
    """``context_parallel`` (DESIGN v1.3): how the ``context`` axes reach keys and values."""

    strategy: Literal["all_gather", "ring"] = Field(
        "all_gather", description="MaxText context_parallel_strategy (default all_gather)"
    )
    load_balance: StrictBool = Field(
        True, description="MaxText context_parallel_load_balance: causal work evened out"
    )


class HardwarePlanRequest(Strict):
    """A plan over all the devices of a hardware cluster (``POST /v1/meshes`` with
    ``hardware``): an abstract plan in JAX's device order for that hardware.

    What the services plan: :class:`app.schemas.meshes.HardwarePlanBody` is this request
    as ``POST /v1/meshes`` sends it (a subclass), and MaxText's keys are validated into
    it (:func:`app.services.hardware.maxtext_plan_request`); neither is copied."""

    hardware: str = _HARDWARE
    topology: str | None = _TOPOLOGY
    slices: JsonInt = _SLICES
    hosts: JsonInt | None = _HOSTS
    ici: dict[AxisName, JsonInt] = Field(
        description="ordered {axis: size} over the fast network (MaxText ici_*); these keys "
        "are the mesh axes; sizes multiply to one slice's / NVLink domain's devices; one -1"
    )
    dcn: dict[AxisName, JsonInt] | None = Field(
        None,
        description="{axis: size} over the slow network (MaxText dcn_*), keys among ici's "
        "(missing: 1); sizes multiply to the slices / domains; one -1",
    )
    allow_split_physical_axes: StrictBool = _SPLIT
    batch_shape: list[BatchDim] | None = Field(
        None, min_length=1, max_length=16, description="global batch shape"
    )
    batch_axes: BatchAxes | None = Field(None, description="mesh axes splitting dimension 0")
    model: HardwareModel | None = Field(
        None, description="adds step_estimate and memory_per_device (needs batch_shape)"
    )
    optimizer: OptimizerField = "adam"
    name: str | None = Field(None, max_length=200)
    pipeline: PipelineSpec | None = Field(None, description="with stage axes: their schedule")
    context_parallel: ContextParallelSpec | None = Field(
        None, description="with context axes: their strategy"
    )
    calibration: str | None = _CALIBRATION


class RecommendationRequest(Strict):
    """``POST /v1/recommendations``: rank every (ici, dcn) factorisation of a cluster."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [RECOMMENDATION_EXAMPLE]}
    )

    hardware: str = _HARDWARE
    topology: str | None = _TOPOLOGY
    slices: JsonInt = _SLICES
    hosts: JsonInt | None = _HOSTS
    model: HardwareModel
    global_batch: JsonInt = Field(ge=1, le=2**40, description="examples or sequences a step")
    top_k: JsonInt = Field(5, ge=1, le=100, description="candidates to return")
    axes: list[AxisName] | None = Field(
        None,
        min_length=1,
        max_length=8,
        description="mesh axis names in order, each with a role: data, fsdp, tensor, "
        "expert, stage or context (aliases batch, replica, model); default data, fsdp, "
        "tensor, and expert when the model has experts",
        examples=[["data", "fsdp", "tensor"]],
    )
    optimizer: OptimizerField = "adam"
    allow_split_physical_axes: StrictBool = _SPLIT
    fixed_ici: dict[AxisName, Annotated[JsonInt, Field(ge=1)]] | None = Field(
        None,
        max_length=8,
        description="ICI sizes to keep as given, {axis: size}; only the other axes are "
        "searched (shrinks the search space)",
        examples=[{"tensor": 4}],
    )
    fixed_dcn: dict[AxisName, Annotated[JsonInt, Field(ge=1)]] | None = Field(
        None,
        max_length=8,
        description="DCN sizes to keep as given; {'fsdp': 1, 'tensor': 1} keeps DCN on "
        "data only (MaxText's usual dcn_data_parallelism)",
        examples=[{"fsdp": 1, "tensor": 1}],
    )
    pipeline: PipelineSpec | None = Field(
        None, description="with stage axes among axes: the schedule every candidate is priced with"
    )
    context_parallel: ContextParallelSpec | None = Field(
        None, description="with context axes among axes: their strategy for every candidate"
    )
    calibration: str | None = _CALIBRATION
