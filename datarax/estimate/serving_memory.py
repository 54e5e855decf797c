"""What a serving deployment holds on each device (DESIGN v1.4, "Serving plans"): the
request's serving options, the layout of one replica (tensor, expert and stage splits,
replicas over the data axes), the weights at their serving dtype, the KV cache per token
and the activations, and from them the KV cache's capacity and the largest batch.

Plain arithmetic over the model spec; nothing touches a device. The time of prefill and
decode is :mod:`datarax.estimate.serving`.

Weights. The matrices every token multiplies through (attention and MLP projections, the
routed and shared experts) are stored at ``weight_dtype`` with the scales it carries:
``float8`` and ``int8`` one float32 scale per output channel (vLLM's channel-wise FP8
and W8A8 checkpoints, MaxText's AQT int8), ``int4`` one bfloat16 scale and a 4-bit zero
point per group of 128 inputs (AWQ's layout, vLLM's ``awq``); the embedding, the
unembedding (``lm_head``), the router and the norm scales stay bfloat16, as those
engines keep them. ``col``/``row`` matrices split over ``tensor``; the k and v
projections hold ``max(1, kv_heads // tensor)`` heads a device (vLLM replicates a kv head
over ``tensor // kv_heads`` devices where ``kv_heads < tensor``); the vocabulary splits
over ``tensor`` (padded); routed experts split over ``expert`` too; the stacked layers
over ``stage`` (the most a stage holds), the embedding on the first stage and the
unembedding on the last.

KV cache, one token on one device, every layer the device holds: ``2 x heads_per_device
x head_dim x layers / stage x bytes(kv_dtype)`` with ``heads_per_device = max(1, kv_heads
// tensor)``; MLA models cache the compressed latent instead, ``(kv_lora_rank +
qk_rope_head_dim) x layers / stage x bytes`` (whole on every tensor device, as vLLM's
MLA backends keep it). On TPU a head's ``head_dim`` (and each of MLA's two widths) is
padded to a multiple of 128, as XLA's compiled decode step holds them in (8, 128) tiles.
``int8`` keys and values carry one bfloat16 scale per token and head (MaxText's
``quantize_kvcache``). An ``expert`` axis splits the batch of the attention and dense
layers (vLLM's data-parallel attention with expert parallelism), so each of its devices
holds the cache of its share of the sequences.

Activations: the largest forward pass's transient tensors, one layer at a time, over the
engine's prefill chunk (vLLM's and TensorRT-LLM's 8,192 batched tokens; JetStream's one
prompt), plus the logits of the batch's last tokens in float32.

Example:
  >>> from datarax.hardware.chips import get_hardware
  >>> from datarax.specs.model_specs import model_spec
  >>> spec = model_spec({"name": "llama3.1-8b"})
  >>> kv_bytes_per_token(spec, ServingLayout(tensor=1), "bfloat16")
  131072
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from datarax.answers.serving import ServingMemory
from datarax.errors import PlanError
from datarax.hardware.entry import Hardware
from datarax.parallel.axis_roles import (
    axis_roles,
    check_expert_split,
    check_tensor_split,
    role_sizes,
)
from datarax.parallel.terms import repeat_per_device
from datarax.specs.model_specs import ModelSpec, ParamGroup, TransformerSpec

__all__ = [
    "ENGINES",
    "KV_DTYPES",
    "SERVING_ROLES",
    "WEIGHT_DTYPES",
    "ServingCapacity",
    "ServingLayout",
    "ServingOptions",
    "kv_bytes_per_token",
    "serving_capacity",
    "serving_layout",
    "weights_bytes_per_device",
]

WEIGHT_DTYPES: dict[str, tuple[float, float]] = {
    "bfloat16": (2.0, 0.0),
    "float8": (1.0, 4.0),
    "int8": (1.0, 4.0),
    "int4": (0.5, 2.5),
}
"""``{weight_dtype: (bytes per weight, scale bytes)}``: the scale bytes are per output
channel (``float8``, ``int8``: one float32 each) or, for ``int4``, per group of
:data:`INT4_GROUP` inputs of an output channel (a bfloat16 scale and a 4-bit zero)."""

INT4_GROUP = 128
"""Inputs sharing one int4 scale (AWQ's and GPTQ's usual group size)."""

KV_DTYPES: dict[str, float] = {"bfloat16": 2.0, "float8": 1.0, "int8": 1.0}
"""Bytes per cached key or value element."""

ENGINES: tuple[str, ...] = ("vllm", "jetstream", "tensorrt-llm")
"""The serving engines priced."""

ENGINE_CHUNK_TOKENS: dict[str, int | None] = {"vllm": 8192, "tensorrt-llm": 8192, "jetstream": None}
"""Tokens an engine prefills in one forward pass (vLLM's ``max_num_batched_tokens`` and
TensorRT-LLM's ``max_num_tokens`` defaults); ``None``: one prompt at a time (JetStream's
prefill engine)."""

SERVING_ROLES: tuple[str, ...] = ("data", "tensor", "expert", "stage")
"""Axis kinds a serving plan takes: ``data`` axes are independent replicas."""

_BF16 = 2.0


@dataclass(frozen=True)
class ServingOptions:
    """The request's ``serving`` object (DESIGN v1.4), checked.

    Attributes:
      input_tokens: mean prompt length per request.
      output_tokens: mean generated length per request.
      max_batch: sequences a replica runs at once (vLLM's ``max_num_seqs``); ``None``:
        the KV cache's.
      concurrency: clients keeping one request each in flight; ``None``: every slot busy.
      max_model_len: the longest sequence the engine admits; ``None``: ``input_tokens +
        output_tokens``.
      weight_dtype, kv_dtype: storage dtypes (:data:`WEIGHT_DTYPES`, :data:`KV_DTYPES`).
      memory_fraction: share of HBM the engine may use (vLLM's
        ``gpu_memory_utilization``).
      engine: ``vllm``, ``jetstream`` or ``tensorrt-llm``.
    """

    input_tokens: int
    output_tokens: int
    max_batch: int | None = None
    concurrency: int | None = None
    max_model_len: int | None = None
    weight_dtype: str = "bfloat16"
    kv_dtype: str = "bfloat16"
    memory_fraction: float = 0.9
    engine: str = "vllm"

    def __post_init__(self) -> None:
        for name in ("input_tokens", "output_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlanError("invalid_serving", f"serving.{name} must be >= 1, got {value!r}")
        for name in ("max_batch", "concurrency", "max_model_len"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise PlanError(
                    "invalid_serving", f"serving.{name} must be an integer >= 1, got {value!r}"
                )
        for name, table in (
            ("weight_dtype", WEIGHT_DTYPES),
            ("kv_dtype", KV_DTYPES),
            ("engine", dict.fromkeys(ENGINES)),
        ):
            if getattr(self, name) not in table:
                raise PlanError(
                    "invalid_serving",
                    f"serving.{name} {getattr(self, name)!r} is not one of {list(table)}",
                )
        fraction = self.memory_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            fraction = -1.0
        if not 0 < fraction <= 1:
            raise PlanError(
                "invalid_serving",
                f"serving.memory_fraction must be in (0, 1], got {self.memory_fraction!r}",
            )
        if self.max_model_len is not None and self.max_model_len < self.sequence_tokens:
            raise PlanError(
                "invalid_serving",
                f"serving.max_model_len {self.max_model_len} is shorter than input_tokens + "
                f"output_tokens ({self.sequence_tokens}): raise it to at least "
                f"{self.sequence_tokens} or leave it out",
            )

    @property
    def sequence_tokens(self) -> int:
        """``input_tokens + output_tokens``: one request's sequence at its end."""
        return self.input_tokens + self.output_tokens

    @property
    def mean_cached_tokens(self) -> int:
        """``input_tokens + output_tokens / 2`` (rounded up): the tokens a sequence holds
        in the cache on average over its life."""
        return self.input_tokens + -(-self.output_tokens // 2)

    @property
    def model_len(self) -> int:
        """``max_model_len``, default the request's sequence."""
        return self.max_model_len or self.sequence_tokens

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ServingOptions:
        """The options of a request's ``serving`` object (unknown members refused).

        Raises:
          PlanError: ``invalid_serving``.
        """
        if not isinstance(data, Mapping):
            raise PlanError("invalid_serving", f"serving must be an object, got {data!r}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise PlanError(
                "invalid_serving", f"serving has no member(s) {unknown}; it takes {sorted(known)}"
            )
        missing = [name for name in ("input_tokens", "output_tokens") if name not in data]
        if missing:
            raise PlanError("invalid_serving", f"serving needs {' and '.join(missing)}")
        return cls(**{k: v for k, v in data.items() if v is not None})

    def to_json(self) -> dict[str, int | float | str | None]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class ServingLayout:
    """One replica's splits and the replicas: the sizes of the axes by kind.

    Attributes:
      tensor: tensor-parallel devices (heads, MLP and vocabulary split).
      expert: expert-parallel devices (routed experts split; the batch of the attention
        and dense layers split as data).
      stage: pipeline stages (layers split).
      replicas: independent copies of the model (the data axes).
      axes: ``{axis: size}`` of the plan, mesh order.
      roles: ``{axis: kind}``.
    """

    tensor: int = 1
    expert: int = 1
    stage: int = 1
    replicas: int = 1
    axes: Mapping[str, int] | None = None
    roles: Mapping[str, str] | None = None

    @property
    def devices_per_replica(self) -> int:
        return self.tensor * self.expert * self.stage

    def axes_of(self, kind: str) -> tuple[str, ...]:
        """The axes over 1 of ``kind``, mesh order."""
        axes, roles = self.axes or {}, self.roles or {}
        return tuple(a for a, n in axes.items() if n > 1 and roles.get(a) == kind)


def serving_layout(
    model: ModelSpec, axes: Mapping[str, int], roles: Mapping[str, str] | None = None
) -> ServingLayout:
    """The serving layout of ``axes`` (``{axis: size}``, ici times dcn), checked.

    Raises:
      PlanError: ``invalid_model`` (an MLP: serving prices transformers);
        ``unknown_axis_role``; ``invalid_parallelism`` for an ``fsdp``, ``context`` or
        ``sequence`` axis over 1 (a serving replica holds whole weights and whole
        sequences), an expert axis on a dense model or one not dividing the experts, more
        stages than layers; ``tensor_not_divisible`` where the
        heads or the MLP do not split over ``tensor``, or kv heads that neither divide
        nor are divided by it.
    """
    if not isinstance(model, TransformerSpec):
        raise PlanError(
            "invalid_model",
            "a serving plan prices a transformer's prefill and decode: give a transformer "
            "or a named model, not an MLP",
        )
    axes = {name: int(size) for name, size in axes.items()}
    roles = axis_roles(list(axes), roles)
    refused = [a for a, n in axes.items() if n > 1 and roles[a] not in SERVING_ROLES]
    if refused:
        raise PlanError(
            "invalid_parallelism",
            f"axes {refused} are {sorted({roles[a] for a in refused})} axes, which a serving "
            f"plan does not take: a replica holds whole weights and whole sequences. Serving "
            f"roles are tensor, expert, stage and data (independent replicas); put those "
            f"devices on tensor or data",
        )
    sizes = role_sizes(axes, roles)
    # stages need not divide the layers (vLLM spreads the remainder): each holds at most
    # ceil(layers / stages)
    check_expert_split(model, sizes["expert"])
    if sizes["stage"] > model.layers:
        raise PlanError(
            "invalid_parallelism",
            f"{sizes['stage']} pipeline stages for {model.layers} layers leave stages "
            f"without a layer: use at most {model.layers} stages",
        )
    check_tensor_split(model, sizes["tensor"])
    t, kv = sizes["tensor"], model.kv_heads
    if model.attention_type == "mha" and t > 1 and kv % t and t % kv:
        raise PlanError(
            "tensor_not_divisible",
            f"model kv_heads {kv} and tensor={t}: one must divide the other (each device "
            f"holds kv_heads / tensor heads, or one head replicated over tensor / kv_heads "
            f"devices); use a tensor size dividing or divided by {kv}",
        )
    return ServingLayout(
        tensor=t,
        expert=sizes["expert"],
        stage=sizes["stage"],
        replicas=sizes["data"],
        axes=axes,
        roles=roles,
    )


def _quantized(group: ParamGroup) -> bool:
    """Whether ``weight_dtype`` stores the group: the matrices tokens multiply through,
    but the unembedding and the router."""
    return (
        group.matmul
        and len(group.shape) >= 2
        and not (group.path.startswith("unembed") or group.path.endswith("/router"))
    )


def _per_device_elements(model: TransformerSpec, group: ParamGroup, layout: ServingLayout) -> float:
    """Elements of one of the group's layers (one of its ``repeat``) a device holds."""
    elements = float(math.prod(group.shape))
    t = layout.tensor
    dim = group.tensor_dim()
    if dim is not None and t > 1:
        width = group.shape[dim]
        if group.path.endswith(("/attn/k", "/attn/v")) and model.attention_type == "mha":
            elements = elements / width * max(1, model.kv_heads // t) * model.head_dim
        else:
            elements = elements / width * math.ceil(width / t)
    if group.expert:
        elements /= layout.expert
    return elements


def _dtype_bytes(group: ParamGroup, elements: float, weight_dtype: str) -> float:
    """Bytes of ``elements`` of the group at its serving dtype, scales included."""
    if not _quantized(group) or weight_dtype == "bfloat16":
        return elements * _BF16
    per_weight, scale = WEIGHT_DTYPES[weight_dtype]
    inputs = group.shape[-2]
    per_group = INT4_GROUP if weight_dtype == "int4" else inputs
    return elements * (per_weight + scale / per_group)


def weights_bytes_per_device(
    model: TransformerSpec, layout: ServingLayout, weight_dtype: str, *, routed_share: float = 1.0
) -> float:
    """The weights one device holds (the most loaded stage: its stacked layers plus the
    larger of the embedding and the unembedding where stages split them).

    Args:
      routed_share: the share of the routed experts counted (1: all of them; a decode
        step reads only those its tokens reach).
    """
    layers = 0.0
    ends = {"first": 0.0, "last": 0.0}
    for group in model.params():
        held = _dtype_bytes(group, _per_device_elements(model, group, layout), weight_dtype)
        held *= routed_share if group.expert else 1.0
        if "*" in group.path:
            layers += held * repeat_per_device(group, layout.stage)
        elif group.path.startswith("embed"):
            ends["first"] += held
        else:
            ends["last"] += held
    if layout.stage > 1:
        return layers + max(ends.values())
    return layers + sum(ends.values())


def kv_bytes_per_token(
    model: TransformerSpec, layout: ServingLayout, kv_dtype: str, *, lanes: int = 1
) -> int:
    """KV cache bytes of one token on one device over the layers it holds (module
    docstring). ``lanes``: the minor-dimension tile a cached head (or an MLA cache's
    latent and rope key, each) is padded to: 128 on TPU, where XLA's (8, 128) tiling
    holds a 64-wide rope key or head in 128 lanes; 1 elsewhere."""
    layers = math.ceil(model.layers / layout.stage)
    size = KV_DTYPES[kv_dtype]
    if model.attention_type == "mla":
        scale = _BF16 if kv_dtype == "int8" else 0.0
        width = sum(-(-n // lanes) * lanes for n in (model.kv_lora_rank, model.qk_rope_head_dim))
        return int(layers * (width * size + scale))
    heads = max(1, model.kv_heads // layout.tensor)
    scale = _BF16 if kv_dtype == "int8" else 0.0
    per_head = -(-model.head_dim // lanes) * lanes * size + scale
    return int(2 * heads * per_head * layers)


def chunk_tokens(options: ServingOptions) -> int:
    """Tokens one prefill pass takes: the engine's chunk (at least one prompt), or one
    prompt."""
    chunk = ENGINE_CHUNK_TOKENS[options.engine]
    return options.input_tokens if chunk is None else max(chunk, options.input_tokens)


def activation_bytes(
    model: TransformerSpec, layout: ServingLayout, options: ServingOptions, batch_rows: int
) -> int:
    """The largest forward pass's activations on one device: one layer's transient
    tensors over a prefill chunk (the residual stream twice, q, k, v and the attention
    output of the device's heads, the MLP's gate and up), bfloat16, plus ``batch_rows``
    rows of float32 logits over the whole vocabulary (gathered for sampling)."""
    tokens = chunk_tokens(options)
    t = layout.tensor
    heads = model.heads / t
    kv = max(1, model.kv_heads // t)
    width = (
        2 * model.d_model
        + (2 * heads + 2 * kv) * max(model.qk_head_dim, model.value_head_dim)
        + 2 * model.ffn_width / t
    )
    return int(tokens * width * _BF16 + batch_rows * model.vocab * 4)


@dataclass(frozen=True)
class ServingCapacity:
    """One device's memory and what the KV cache holds.

    Attributes:
      memory: the answer's ``memory_per_device`` (the KV cache of the priced batch).
      weights_bytes: the weights one device holds.
      kv_bytes_per_token: one token's cache on one device.
      kv_capacity_tokens: tokens one replica's cache holds.
      max_batch: sequences of ``input_tokens + output_tokens`` one replica holds.
      batch: sequences priced per replica.
    """

    memory: ServingMemory
    weights_bytes: int
    kv_bytes_per_token: int
    kv_capacity_tokens: int
    max_batch: int
    batch: int


def serving_capacity(
    model: TransformerSpec, hw: Hardware, layout: ServingLayout, options: ServingOptions
) -> ServingCapacity:
    """Weights, KV cache and activations per device, the cache's capacity, the largest
    batch and the batch priced (module docstring). ``batch``: without ``max_batch`` and
    ``concurrency``, the KV cache's ``max_batch`` (every sequence at its full length);
    with either, the request's ``max_batch`` and the replica's share of ``concurrency``,
    capped by the sequences whose mean cached length (``input_tokens + output_tokens /
    2``, staggered under continuous batching) the cache holds; at least 1, so a plan that
    does not fit is still priced. ``kv_cache``: the priced batch's sequences at their
    full length, or at their mean where only that fits."""
    weights = int(weights_bytes_per_device(model, layout, options.weight_dtype))
    lanes = 128 if hw.kind == "tpu" else 1  # TPU tiles the cache's minor dimension
    per_token = kv_bytes_per_token(model, layout, options.kv_dtype, lanes=lanes)
    usable = int(hw.hbm_bytes * options.memory_fraction)
    rows = options.max_batch or 256  # vLLM's default max_num_seqs sizes its logits
    activations = activation_bytes(model, layout, options, rows)
    free = max(0, usable - weights - activations)
    # each expert device holds the cache of its share of the sequences
    per_device = free // per_token
    capacity = per_device * layout.expert
    kv_max = capacity // options.sequence_tokens
    batch = kv_max
    if options.max_batch is not None or options.concurrency is not None:
        # an engine admits sequences while their mean cached length fits: staggered under
        # continuous batching, a sequence holds input + output / 2 tokens on average
        batch = capacity // options.mean_cached_tokens
    if options.max_batch is not None:
        batch = min(batch, options.max_batch)
    if options.concurrency is not None:
        batch = min(batch, -(-options.concurrency // layout.replicas))
    batch = max(1, batch)
    per_device_sequences = -(-batch // layout.expert)
    held = options.sequence_tokens if batch <= kv_max else options.mean_cached_tokens
    kv_cache = per_device_sequences * held * per_token
    total = weights + kv_cache + activations
    fits = total <= usable and per_device >= options.model_len
    memory = ServingMemory(
        weights=weights,
        kv_cache=kv_cache,
        activations=activations,
        total=total,
        usable=usable,
        fits=fits,
    )
    return ServingCapacity(memory, weights, per_token, capacity, kv_max, batch)
