"""The catalog answers: hardware entries (``GET /v1/hardware``) and named models
(``GET /v1/models``).

One definition each: the library's catalog entry :class:`datarax.hardware.entry.Hardware`
is a :class:`HardwareEntry` (adding its checks, its derived figures and the fields the
answer leaves out), and :data:`datarax.specs.named_models.MODELS` holds
:class:`NamedModelEntry` answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from datarax.answers.base import Answer, omitted
from datarax.answers.estimates import LinkClass

__all__ = ["HardwareEntry", "HardwareList", "ModelSpec", "NamedModelEntry", "NamedModelList"]

ModelSpec = dict[str, Any]
"""A ``model`` object as the request gave it (echoed by plans and sessions): the MLP
(``kind: "mlp"``, ``features``), a transformer (``kind: "transformer"`` and its figures) or
a named model (``name`` and the fields given beside it). Its fields are defined once, by
the request models of the service (``app.schemas.hardware``: ``HardwareMlpModel``,
``TransformerModel``, ``NamedModel``)."""


@dataclass(frozen=True, eq=False)
class HardwareEntry(Answer):
    """One catalog entry (DESIGN v1.1; ``GET /v1/hardware/{name}``): an accelerator type
    and the networks around it. Every figure is per device and one direction (HBM sizes
    binary); ``sources`` names the public source of each.

    The defaults are the catalog's own (an entry states what differs); every member is
    always sent."""

    __pydantic_config__: ClassVar[dict[str, Any]] = {
        **Answer.__pydantic_config__,
        # every member is sent, the defaulted ones too: the answer's schema requires them
        "json_schema_serialization_defaults_required": True,
    }

    name: str
    """catalog name, e.g. tpu-v5e"""
    kind: Literal["tpu", "gpu", "cpu"]
    device_kind: str
    """jax.Device.device_kind as JAX reports it, where known"""
    hbm_bytes: int
    """HBM per device, bytes"""
    peak_bf16_flops: float
    """dense bf16 FLOP/s per device"""
    devices_per_host: int
    """devices attached to one host (TPU VM / GPU node / NVL72 tray)"""
    fast_domain_devices: int
    """largest ICI slice (TPU) or NVLink domain (GPU)"""
    fast_link_bytes_per_s: float
    """one direction of one fast link (ICI / NVLink)"""
    slow_link_bytes_per_s: float
    """one direction of one host's DCN / InfiniBand"""
    topologies: tuple[str, ...]
    """TPU slice shapes accepted ('16x16'); empty for GPU and CPU"""
    sources: Mapping[str, str]
    """figure name -> public source (and which one was taken where they differ)"""
    hbm_bytes_per_s: float = 0.0
    """HBM bandwidth per device"""
    fast_links_per_device: int = 1
    """ICI links per chip (TPU); 1 for the NVLink egress of a GPU"""
    cores_per_chip: int = 1
    """TensorCores JAX sees as one device (v4/v5p megacore: 2); 1 elsewhere"""
    devices_per_chip: int = 1
    """JAX devices one chip exposes (TPU7x: 2, one per TensorCore); 1 elsewhere. Every
    per-device figure is then the chip's divided by it"""
    fast_link: LinkClass = "ici"
    """link class of the fast network: ici, nvlink or host"""
    slow_link: LinkClass = "dcn"
    """link class of the slow network: dcn, infiniband or host"""
    fast_link_latency_s: float = 1e-6
    """per-hop latency of the fast network (the alpha of alpha-beta)"""
    slow_link_latency_s: float = 1e-5
    """per-step latency of the slow network"""
    torus_dims: int = 0
    """TPU: dimensions of the chips' physical coordinates (2 or 3), which says where a
    slice's ICI wraps round; 0 elsewhere"""
    vmem_bytes: int | None = None
    """on-chip vector memory (VMEM) of one TensorCore (TPU), bytes; null where the device
    has no such compiler-managed memory"""
    usable_hbm_bytes: int | None = None
    """the HBM XLA lets one program allocate on a device, where a plan's fits is judged;
    null: hbm_bytes"""
    update_layout_copies: bool = False
    """XLA runs the optimizer update of an MLP's first kernel in the transposed layout and
    copies the kernel and its moments to it"""
    peak_fp32_flops: float = 0.0
    """dense float32 matmul FLOP/s per device; 0: the bf16 peak"""
    host_memory_bytes: int | None = None
    """DRAM of one host, where offloaded activations live; null: unknown"""
    host_link_bytes_per_s: float = 0.0
    """one direction of one device's link to host memory (offload transfers); 0: unknown"""
    notes: str = ""
    """one line a reader should know (e.g. nominal figures)"""


@dataclass(frozen=True, eq=False)
class HardwareList(Answer):
    """``GET /v1/hardware``: every catalog entry, in catalog order."""

    # field(): no default (a bare annotation takes the inherited Mapping.items for one)
    items: list[HardwareEntry] = field()  # type: ignore[assignment]


@dataclass(frozen=True, eq=False, kw_only=True)
class NamedModelEntry(Answer):
    """A named model (DESIGN v1.2; ``GET /v1/models/{name}``): a transformer ``model``
    object with its ``source``. A request names one as ``{"name": "llama3.1-8b", ...}``;
    the other fields override the entry's."""

    name: str
    """e.g. llama3.1-8b"""
    kind: Literal["transformer"]
    layers: int
    d_model: int
    d_ff: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    seq_len: int
    """the length the family was pre-trained with (the model card)"""
    mlp: Literal["gated", "plain"]
    tied_embeddings: bool
    num_experts: int | None = omitted()
    """mixture-of-experts models only (DESIGN v1.3): routed experts per MoE layer"""
    experts_per_token: int | None = omitted()
    shared_experts: int | None = omitted()
    moe_d_ff: int | None = omitted()
    first_dense_layers: int | None = omitted()
    moe_every: int | None = omitted()
    attention_type: Literal["mha", "mla"] | None = omitted()
    """MLA attention only (DESIGN v1.3)"""
    q_lora_rank: int | None = omitted()
    kv_lora_rank: int | None = omitted()
    qk_nope_head_dim: int | None = omitted()
    qk_rope_head_dim: int | None = omitted()
    v_head_dim: int | None = omitted()
    total_params: int
    """every parameter of the model (the embedding, and the unembedding where untied,
    included)"""
    active_params: int
    """the parameters a token sees: a mixture-of-experts model's routed experts counted
    experts_per_token times, not num_experts; total_params for a dense model"""
    source: str
    """MaxText's configs/models/<name>.yml and the model card"""
    notes: str | None = omitted()
    """what the model has that is not priced here"""


@dataclass(frozen=True, eq=False)
class NamedModelList(Answer):
    """``GET /v1/models``: every named model."""

    # field(): no default (a bare annotation takes the inherited Mapping.items for one)
    items: list[NamedModelEntry] = field()  # type: ignore[assignment]
