"""Serving answers (DESIGN v1.4, "Serving plans"): a serving plan's ``serving_estimate``
and its ``memory_per_device``, and the serving recommendations of
``POST /v1/recommendations`` with ``serving``.

One definition each, built by the library (:mod:`datarax.estimate.serving`,
:mod:`datarax.estimate.serving_recommend`), serialised by the service and parsed back by
the client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from datarax.answers.base import Answer, examples, omitted

__all__ = [
    "ServingCandidate",
    "ServingEstimate",
    "ServingMemory",
    "ServingRecommendations",
    "ServingRejection",
]

_MEMORY_EXAMPLE: dict[str, Any] = {
    "weights": 16060522496,
    "kv_cache": 55834574848,
    "activations": 1090519040,
    "total": 72985616384,
    "usable": 77309411328,
    "fits": True,
}

_ESTIMATE_EXAMPLE: dict[str, Any] = {
    "replicas": 8,
    "weights_bytes": 16060522496,
    "kv_bytes_per_token": 131072,
    "kv_capacity_tokens": 460406,
    "max_batch": 230,
    "batch": 64,
    "ttft_s": 0.081,
    "tpot_s": 0.0118,
    "output_tokens_per_s": 43388.0,
    "requests_per_s": 43.4,
    "bottleneck": "memory",
    "calibration": "published-gpu-vllm",
    "engine": "vllm",
    "devices_per_replica": 1,
    "prefill_s": 0.079,
    "decode_step_s": 0.0105,
    "output_tokens_per_s_per_device": 5423.5,
}


@dataclass(frozen=True, eq=False)
class ServingMemory(Answer):
    """A serving plan's bytes per device (``memory_per_device`` of a plan with
    ``serving``): the weights, the KV cache the priced batch holds, the activations and
    the engine's reserve (``usable``: the HBM times ``memory_fraction``)."""

    __pydantic_config__: ClassVar[dict[str, Any]] = examples(_MEMORY_EXAMPLE)

    weights: int
    """the model's weights one device holds, at weight_dtype with their scales"""
    kv_cache: int
    """the KV cache of the priced batch's sequences (input_tokens + output_tokens each, or
    their mean length where the batch holds only that)"""
    activations: int
    """the largest forward pass's activations and logits (a prefill chunk)"""
    total: int
    """weights + kv_cache + activations"""
    usable: int
    """the HBM the engine may use: hbm_bytes x memory_fraction"""
    fits: bool
    """total within usable, and at least one sequence of max_model_len tokens fits"""


@dataclass(frozen=True, eq=False)
class ServingEstimate(Answer):
    """A serving deployment's capacity, latency and throughput (``serving_estimate``):
    :func:`datarax.estimate.serving.estimate_serving` says how each is priced."""

    __pydantic_config__: ClassVar[dict[str, Any]] = examples(_ESTIMATE_EXAMPLE)

    replicas: int
    """independent copies of the model (the data axes' product)"""
    weights_bytes: int
    """weights per device, bytes (weight_dtype with its scales)"""
    kv_bytes_per_token: int
    """KV cache bytes of one token on one device, over every layer the device holds (its
    share of the kv heads, replicated where kv_heads < tensor; MLA's compressed latent)"""
    kv_capacity_tokens: int
    """tokens one replica's KV cache holds after weights and activations"""
    max_batch: int
    """the most concurrent sequences of input_tokens + output_tokens a replica holds"""
    batch: int
    """concurrent sequences priced per replica: without serving.max_batch and
    concurrency, max_batch; with either, the request's max_batch or the replica's share of
    concurrency, whichever is fewer, capped by the sequences the KV cache holds at their
    mean length (input_tokens + output_tokens / 2, staggered under continuous batching)"""
    ttft_s: float
    """mean time to first token: the prompt's prefill, plus the wait for a slot when
    clients outnumber the slots"""
    tpot_s: float
    """mean time per output token after the first, the batch's prefills included"""
    output_tokens_per_s: float
    """generated tokens per second over all replicas"""
    requests_per_s: float
    """completed requests per second over all replicas"""
    bottleneck: Literal["compute", "memory", "communication"]
    """what takes most of a request's time at the priced batch"""
    calibration: str
    """the serving profile whose constants priced the times"""
    engine: str
    """the serving engine priced: vllm, jetstream or tensorrt-llm"""
    devices_per_replica: int | None = omitted()
    """tensor x expert x stage"""
    prefill_s: float | None = omitted()
    """one prompt's prefill alone on a replica"""
    decode_step_s: float | None = omitted()
    """one decode step of the priced batch"""
    output_tokens_per_s_per_device: float | None = omitted()
    """output_tokens_per_s over every device of the plan"""


@dataclass(frozen=True, eq=False)
class ServingRejection(Answer):
    """A layout a serving recommendation rejected, and why."""

    ici: dict[str, int]
    dcn: dict[str, int]
    code: str
    """does_not_fit: the weights and one sequence's KV cache pass the usable HBM;
    misses_slo: ttft_s or tpot_s above the slo; invalid_parallelism,
    tensor_not_divisible: the split does not apply to the model; a planner's code
    (physical_axes_split_required ...): the layout cannot be laid out"""
    reason: str
    """the figures that failed, e.g. ttft_s 0.41 > slo 0.2"""


@dataclass(frozen=True, eq=False)
class ServingCandidate(Answer):
    """One recommended serving layout: its sizes, its estimate and the plan request that
    plans it."""

    rank: int
    """1 for the best"""
    ici: dict[str, int]
    dcn: dict[str, int]
    serving_estimate: ServingEstimate
    memory_per_device: ServingMemory
    plan_request: dict[str, Any]
    """a POST /v1/meshes body, as it is"""


@dataclass(frozen=True, eq=False)
class ServingRecommendations(Answer):
    """``POST /v1/recommendations`` with ``serving``: layouts meeting the ``slo``, most
    output tokens per second per device first, and every rejected layout with why."""

    candidates: list[ServingCandidate]
    """best first"""
    considered: int
    """layouts (tensor, expert, stage and replica splits) priced or rejected"""
    rejected: dict[str, int]
    """rejected layouts by code"""
    rejections: list[ServingRejection]
    """each rejected layout with its reason"""
    ranked_by: str
    slo: dict[str, float] | None = omitted()
    """the request's slo: ttft_s and tpot_s, seconds"""
    note: str | None = omitted()
    """why fewer than top_k candidates came back"""
