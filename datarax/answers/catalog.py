"""The catalog answers: hardware entries and named models.

Transitional: these are the client's TypedDicts, moved here to become
:class:`~datarax.answers.base.Answer` dataclasses (one definition read by the service and
the client)."""

from typing import Any, Literal, NotRequired, TypedDict


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


__all__ = ["ModelSpec", "NamedModel", "NamedModelList", "HardwareEntry", "HardwareList"]
