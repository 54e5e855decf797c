"""The fields of a plan's ``model`` object, checked: sizes, dtypes, MaxText's remat
policies, mixture-of-experts and multi-head latent attention fields.

:mod:`datarax.specs.model_specs` builds its specs from what these functions return;
every refusal is a :class:`~datarax.errors.PlanError` with code
``invalid_model`` that names the field and what it accepts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypedDict

from datarax.errors import PlanError

__all__ = [
    "ATTENTION_KINDS",
    "ATTENTION_TYPES",
    "DTYPE_BYTES",
    "MAXTEXT_REMAT",
    "MLA_FIELDS",
    "MLP_REMAT",
    "MOE_FIELDS",
    "MOE_KERNELS",
    "REMAT_PLACES",
    "REMAT_POLICIES",
    "REMAT_TENSORS",
    "check_choice",
    "check_dtype",
    "positive_int",
    "transformer_fields",
]

DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per element of the dtypes a model spec accepts."""

MLP_REMAT: tuple[str, ...] = ("none", "full")


REMAT_TENSORS: tuple[str, ...] = (
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
)
"""MaxText's ``checkpoint_name``\\ s of one decoder layer (``layers/decoders.py``,
``layers/attentions.py``, ``layers/linears.py``), the keys of ``remat_custom``."""

REMAT_PLACES: tuple[str, ...] = ("device", "offload", "remat")
"""Where a named tensor goes under ``remat: custom`` (MaxText's ``RematLocation``)."""

_QKV = ("query_proj", "key_proj", "value_proj", "qkv_proj")
_MLP_ALL = ("mlpwi", "mlpwi_0", "mlpwi_1", "mlpwo")
MAXTEXT_REMAT: dict[str, dict[str, str] | None] = {
    "none": None,
    "minimal": dict.fromkeys((*_QKV, "out_proj", *_MLP_ALL), "device"),
    "minimal_with_context": dict.fromkeys((*_QKV, "context", "out_proj", *_MLP_ALL), "device"),
    "save_dot_with_context_except_mlp": dict.fromkeys((*_QKV, "context", "out_proj"), "device"),
    "save_dot_except_mlpwi": dict.fromkeys((*_QKV, "out_proj", "mlpwo"), "device"),
    "save_dot_except_mlp": dict.fromkeys((*_QKV, "out_proj"), "device"),
    "save_qkv_proj": dict.fromkeys(_QKV, "device"),
    "qkv_proj_offloaded": dict.fromkeys(("query_proj", "key_proj", "value_proj"), "offload"),
    "minimal_offloaded": dict.fromkeys((*_QKV, "out_proj", *_MLP_ALL), "offload"),
    "save_out_proj": {"out_proj": "device"},
    "full": {},
    "custom": {},
}
"""MaxText's ``remat_policy`` names and the tensors each keeps (``device``) or moves to host
memory (``offload``) for the backward pass; every other named tensor is recomputed
(``Decoder.get_remat_policy`` in MaxText's ``layers/decoders.py`` at commit
``8cbea6617945cdcb0e1dd54b1d842a1dedb9a19e``: ``minimal`` is
``checkpoint_dots_with_no_batch_dims``, which saves every projection, the attention's
batched einsums excluded; the ``save_*`` policies are ``save_only_these_names`` of the
names listed; the ``*_offloaded`` ones ``save_and_offload_only_these_names`` to
``pinned_host``). ``none`` is no ``jax.checkpoint`` at all (everything the autodiff wants
is kept); ``full`` keeps only the layer's input (the scan's carry). ``custom`` takes its
places from ``remat_custom``. The layer input (``decoder_layer_input``, the scan carry)
stays on the device unless ``custom`` says otherwise."""

REMAT_POLICIES: tuple[str, ...] = tuple(MAXTEXT_REMAT)
ATTENTION_KINDS: tuple[str, ...] = ("flash", "dot")


MOE_FIELDS: tuple[str, ...] = (
    "num_experts",
    "experts_per_token",
    "shared_experts",
    "moe_d_ff",
    "first_dense_layers",
    "moe_every",
    "capacity_factor",
    "moe_kernel",
)
"""The mixture-of-experts fields of a transformer ``model`` (DESIGN v1.3)."""

MLA_FIELDS: tuple[str, ...] = (
    "attention_type",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
)
"""The fields of DeepSeek's multi-head latent attention (``attention_type: mla``)."""

MOE_KERNELS: tuple[str, ...] = ("sparse", "dense")
ATTENTION_TYPES: tuple[str, ...] = ("mha", "mla")


class MoEFields(TypedDict, total=False):
    """The checked mixture-of-experts fields (empty for a dense model)."""

    num_experts: int
    experts_per_token: int
    shared_experts: int
    moe_d_ff: int
    first_dense_layers: int
    moe_every: int
    moe_kernel: str
    capacity_factor: float


class MLAFields(TypedDict, total=False):
    """The checked multi-head latent attention fields (empty for ``mha``)."""

    attention_type: str
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


def positive_int(spec: Mapping[str, Any], key: str) -> int:
    value = spec.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(
            "invalid_model",
            f"model.{key} must be a positive integer, got {value!r}",
        )
    return value


def check_dtype(value: object, default: str) -> str:
    value = default if value is None else value
    if value not in DTYPE_BYTES:
        raise PlanError(
            "invalid_model", f"model.dtype {value!r} is not one of {sorted(DTYPE_BYTES)}"
        )
    return str(value)


def check_choice(model: Mapping[str, Any], key: str, allowed: tuple[str, ...], default: str) -> str:
    value = model.get(key)
    value = default if value is None else value
    if value not in allowed:
        raise PlanError("invalid_model", f"model.{key} {value!r} is not one of {list(allowed)}")
    return str(value)


def transformer_fields(model: Mapping[str, Any], dtype: str) -> dict[str, Any]:
    """The checked fields of a transformer ``model`` object, as :class:`TransformerSpec`'s
    keyword arguments (``name`` aside).

    Raises:
      PlanError: code ``invalid_model`` naming the field and what is accepted.
    """
    sizes = {
        key: positive_int(model, key)
        for key in ("layers", "d_model", "d_ff", "heads", "kv_heads", "vocab", "seq_len")
    }
    head_dim = model.get("head_dim")
    if head_dim is None:
        if sizes["d_model"] % sizes["heads"]:
            raise PlanError(
                "invalid_model",
                f"model.d_model {sizes['d_model']} is not a multiple of heads "
                f"{sizes['heads']}; choose heads dividing d_model or give head_dim",
            )
        head_dim = sizes["d_model"] // sizes["heads"]
    else:
        head_dim = positive_int(model, "head_dim")
    if sizes["heads"] % sizes["kv_heads"]:
        raise PlanError(
            "invalid_model",
            f"model.heads {sizes['heads']} is not a multiple of kv_heads "
            f"{sizes['kv_heads']}; choose kv_heads dividing heads",
        )
    mlp = check_choice(model, "mlp", ("gated", "plain"), "gated")
    remat = check_choice(model, "remat", REMAT_POLICIES, "none")
    attention = check_choice(model, "attention", ATTENTION_KINDS, "flash")
    param_dtype = check_dtype(model.get("param_dtype"), dtype)
    tied = model.get("tied_embeddings", False)
    if not isinstance(tied, bool):
        raise PlanError("invalid_model", f"model.tied_embeddings must be a boolean, got {tied!r}")
    tiling = model.get("vocab_tiling", 1)
    tiling = 1 if tiling is None else tiling
    if isinstance(tiling, bool) or not isinstance(tiling, int) or tiling < 1:
        raise PlanError(
            "invalid_model", f"model.vocab_tiling must be a positive integer, got {tiling!r}"
        )
    if sizes["seq_len"] % tiling:
        raise PlanError(
            "invalid_model",
            f"model.vocab_tiling {tiling} does not divide seq_len {sizes['seq_len']}: each "
            "tile is a slice of every sequence; choose a divisor of seq_len",
        )
    custom = model.get("remat_custom") or {}
    if not isinstance(custom, Mapping):
        raise PlanError(
            "invalid_model", f"model.remat_custom must map tensor names to places, got {custom!r}"
        )
    if custom and remat != "custom":
        raise PlanError(
            "invalid_model",
            f"model.remat_custom applies to remat 'custom' only (remat is {remat!r}); "
            "set remat to 'custom' or drop remat_custom",
        )
    for tensor, place in custom.items():
        if tensor not in REMAT_TENSORS:
            raise PlanError(
                "invalid_model",
                f"model.remat_custom names {tensor!r}, not one of MaxText's {list(REMAT_TENSORS)}",
            )
        if place not in REMAT_PLACES:
            raise PlanError(
                "invalid_model",
                f"model.remat_custom.{tensor} is {place!r}; use one of {list(REMAT_PLACES)}",
            )
    moe = _moe_fields(model, sizes["layers"])
    mla = _mla_fields(model, sizes["heads"], sizes["kv_heads"])
    if mla:
        # MLA's query and key heads are nope + rope wide: a head_dim of another width
        # would be read by nothing (DESIGN v1.4, every input used or refused)
        qk = mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
        if model.get("head_dim") is not None and head_dim != qk:
            raise PlanError(
                "invalid_model",
                f"model.head_dim {head_dim} is not used with attention_type 'mla', whose "
                f"query and key heads are qk_nope_head_dim + qk_rope_head_dim = {qk} wide "
                f"(values v_head_dim): leave head_dim out or give {qk}",
            )
        head_dim = qk
    return dict(
        **sizes,
        **moe,
        **mla,
        mlp=mlp,
        dtype=dtype,
        remat=remat,
        param_dtype=param_dtype,
        head_dim=head_dim,
        tied_embeddings=tied,
        attention=attention,
        vocab_tiling=tiling,
        remat_custom=tuple(sorted(custom.items())),
    )


def _count(model: Mapping[str, Any], key: str, default: int, low: int = 0) -> int:
    value = model.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise PlanError(
            "invalid_model", f"model.{key} must be an integer of at least {low}, got {value!r}"
        )
    return value


def _moe_fields(model: Mapping[str, Any], layers: int) -> MoEFields:
    """The mixture-of-experts fields, checked; ``{}`` for a dense model (``num_experts``
    absent, 0 or 1), which may not carry the others."""
    experts = _count(model, "num_experts", 0)
    given = [key for key in MOE_FIELDS[1:] if model.get(key) is not None]
    if experts <= 1:
        if given:
            raise PlanError(
                "invalid_model",
                f"model.{given[0]} applies to mixture-of-experts models only; give "
                "num_experts (2 or more) or drop it",
            )
        return {}
    per_token = _count(model, "experts_per_token", 1, low=1)
    if per_token > experts:
        raise PlanError(
            "invalid_model",
            f"model.experts_per_token {per_token} is more than num_experts {experts}",
        )
    out: MoEFields = {
        "num_experts": experts,
        "experts_per_token": per_token,
        "shared_experts": _count(model, "shared_experts", 0),
        "moe_d_ff": _count(model, "moe_d_ff", 0, low=1),
        "first_dense_layers": _count(model, "first_dense_layers", 0),
        "moe_every": _count(model, "moe_every", 1, low=1),
        "moe_kernel": check_choice(model, "moe_kernel", MOE_KERNELS, "sparse"),
    }
    if out["first_dense_layers"] >= layers:
        raise PlanError(
            "invalid_model",
            f"model.first_dense_layers {out['first_dense_layers']} leaves none of the "
            f"{layers} layers to experts; use fewer than {layers}",
        )
    if out["moe_every"] > layers - out["first_dense_layers"]:
        raise PlanError(
            "invalid_model",
            f"model.moe_every {out['moe_every']} leaves no mixture-of-experts layer after "
            f"the {out['first_dense_layers']} dense ones of {layers}",
        )
    factor = model.get("capacity_factor", -1.0)
    factor = -1.0 if factor is None else factor
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not math.isfinite(factor):
        raise PlanError(
            "invalid_model",
            f"model.capacity_factor must be a number (0 or less: dropless), got {factor!r}",
        )
    out["capacity_factor"] = float(factor)
    if out["moe_kernel"] == "dense" and factor <= 0:
        raise PlanError(
            "invalid_model",
            "model.moe_kernel 'dense' pads each expert to its capacity and needs a "
            "capacity_factor over 0 (MaxText's dense path drops what passes it); give one, "
            "or use the dropless 'sparse' kernel",
        )
    return out


def _mla_fields(model: Mapping[str, Any], heads: int, kv_heads: int) -> MLAFields:
    """The MLA fields, checked; ``{}`` for ``attention_type: mha`` (the default), which
    may not carry them."""
    kind = check_choice(model, "attention_type", ATTENTION_TYPES, "mha")
    given = [key for key in MLA_FIELDS[1:] if model.get(key) is not None]
    if kind == "mha":
        if given:
            raise PlanError(
                "invalid_model",
                f"model.{given[0]} applies to attention_type 'mla' only; set attention_type "
                "to 'mla' or drop it",
            )
        return {}
    if kv_heads != heads:
        raise PlanError(
            "invalid_model",
            f"attention_type 'mla' has as many key and value heads as query heads: set "
            f"kv_heads to heads ({heads}), not {kv_heads}",
        )
    for key in MLA_FIELDS[2:]:
        if model.get(key) is None:
            raise PlanError("invalid_model", f"attention_type 'mla' needs model.{key}")
    return {
        "attention_type": "mla",
        "q_lora_rank": _count(model, "q_lora_rank", 0),
        "kv_lora_rank": _count(model, "kv_lora_rank", 0, low=1),
        "qk_nope_head_dim": _count(model, "qk_nope_head_dim", 0, low=1),
        "qk_rope_head_dim": _count(model, "qk_rope_head_dim", 0, low=1),
        "v_head_dim": _count(model, "v_head_dim", 0, low=1),
    }
