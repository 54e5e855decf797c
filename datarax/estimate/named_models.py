"""Named models: the dense decoder-only transformers people train, as plan requests take them.

Each entry is a ``model`` object of DESIGN v1.2 (``{"kind": "transformer", ...}``) plus a
``source``; ``{"name": "llama3.1-8b", "remat": "full"}`` in a request is the entry with
its ``remat`` replaced (:func:`datarax.estimate.model_specs.model_spec`).

Figures come from MaxText's ``MaxText/configs/models/<name>.yml`` (repository
AI-Hypercomputer/maxtext; the commit read is in each ``source``), which takes them from
the model cards. ``seq_len`` is the length the family was pre-trained with (the model card),
not MaxText's ``max_target_length`` default (2048). What this model does not have, and the
entry's ``notes`` say where it matters: Gemma 2's alternating local/global attention, its
extra post-norms and logit soft-capping; Mistral's sliding window; GPT-3's learned positions
and biases. None of them change the parameter count by more than 0.1% or the FLOPs of the
matmuls.

Example:
  >>> named_model("llama3.1-8b")["d_ff"]
  14336
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from datarax.distributed.errors import PlanError
from datarax.json_types import JSONObject

__all__ = ["MODELS", "models_json", "named_model"]

_MT = "https://github.com/AI-Hypercomputer/maxtext/blob"


def _src(commit: str, name: str, card: str) -> str:
    return f"{_MT}/{commit}/MaxText/configs/models/{name}.yml; {card}"


def _llama(layers: int, d: int, f: int, heads: int, kv: int, vocab: int, seq: int) -> JSONObject:
    return {
        "kind": "transformer",
        "layers": layers,
        "d_model": d,
        "d_ff": f,
        "heads": heads,
        "kv_heads": kv,
        "head_dim": d // heads,
        "vocab": vocab,
        "seq_len": seq,
        "mlp": "gated",
        "tied_embeddings": False,
    }


_LLAMA2 = "Llama 2 paper (Touvron et al. 2023, https://arxiv.org/abs/2307.09288): 4k context"
_LLAMA3 = (
    "Llama 3 herd paper (Grattafiori et al. 2024, https://arxiv.org/abs/2407.21783): "
    "pre-trained on 8k sequences"
)

_ENTRIES: dict[str, dict[str, Any]] = {
    "llama2-7b": {
        **_llama(32, 4096, 11008, 32, 32, 32000, 4096),
        "source": _src("a2413ecbf949192d8048f63565f92ee9ea1ee5f1", "llama2-7b", _LLAMA2),
    },
    "llama2-13b": {
        **_llama(40, 5120, 13824, 40, 40, 32000, 4096),
        "source": _src("ea95bd312ff4045ac1a6e9e63f5062fb6256d556", "llama2-13b", _LLAMA2),
    },
    "llama2-70b": {
        **_llama(80, 8192, 28672, 64, 8, 32000, 4096),
        "source": _src("fd53b7c3026ea374f67b9528ccedd0d47ca59cd2", "llama2-70b", _LLAMA2),
    },
    "llama3.1-8b": {
        **_llama(32, 4096, 14336, 32, 8, 128256, 8192),
        "source": _src("a4c000115fe852d71a38c80dc8d1ab273623e78a", "llama3.1-8b", _LLAMA3),
    },
    "llama3.1-70b": {
        **_llama(80, 8192, 28672, 64, 8, 128256, 8192),
        "source": _src("b0b51f30419ebec7f5a3ae2ccf7f8324f1afc2b2", "llama3.1-70b", _LLAMA3),
    },
    "llama3.1-405b": {
        **_llama(126, 16384, 53248, 128, 8, 128256, 8192),
        "source": _src("134af88147ed4f9f42d7634b8bacf2f1aedbe78b", "llama3.1-405b", _LLAMA3),
    },
    "mistral-7b": {
        **_llama(32, 4096, 14336, 32, 8, 32000, 8192),
        "source": _src(
            "05dc58b2166aeb5632b9e5864f63f03e3c6cc37b",
            "mistral-7b",
            "Mistral 7B paper (Jiang et al. 2023, https://arxiv.org/abs/2310.06825): 8k context",
        ),
        "notes": "the 4096-token sliding window is not modelled: attention is priced causal "
        "over the whole sequence",
    },
    "gemma2-9b": {
        "kind": "transformer",
        "layers": 42,
        "d_model": 3584,
        "d_ff": 14336,
        "heads": 16,
        "kv_heads": 8,
        "head_dim": 256,
        "vocab": 256128,
        "seq_len": 8192,
        "mlp": "gated",
        "tied_embeddings": True,
        "source": _src(
            "0dae4e9353240a14ffa430db95a6c081a934a978",
            "gemma2-9b",
            "Gemma 2 paper (Gemma Team 2024, https://arxiv.org/abs/2408.00118): 42 layers, "
            "8k context (MaxText's base_num_decoder_layers 21 counts local+global pairs)",
        ),
        "notes": "GeGLU MLP priced as gated; local/global attention, post-norms and soft "
        "caps are not modelled",
    },
    "gemma2-27b": {
        "kind": "transformer",
        "layers": 46,
        "d_model": 4608,
        "d_ff": 36864,
        "heads": 32,
        "kv_heads": 16,
        "head_dim": 128,
        "vocab": 256128,
        "seq_len": 8192,
        "mlp": "gated",
        "tied_embeddings": True,
        "source": _src(
            "0ed7bd529b9d690570473c3525d1efeda6b6c944",
            "gemma2-27b",
            "Gemma 2 paper: 46 layers (MaxText's 23 counts local+global pairs)",
        ),
        "notes": "GeGLU MLP priced as gated; local/global attention, post-norms and soft "
        "caps are not modelled",
    },
    "gpt3-175b": {
        "kind": "transformer",
        "layers": 96,
        "d_model": 12288,
        "d_ff": 49152,
        "heads": 96,
        "kv_heads": 96,
        "head_dim": 128,
        "vocab": 50304,
        "seq_len": 2048,
        "mlp": "plain",
        "tied_embeddings": True,
        "source": _src(
            "05cc075ebe28121eea6db61f6cba05c7164a6ce2",
            "gpt3-175b",
            "GPT-3 paper (Brown et al. 2020, https://arxiv.org/abs/2005.14165): 2048 context; "
            "vocabulary padded to 50304 as MaxText does",
        ),
        "notes": "learned position embeddings and biases are not modelled (0.01% of "
        "the parameters)",
    },
}

MODELS: MappingProxyType[str, MappingProxyType[str, Any]] = MappingProxyType(
    {name: MappingProxyType(entry) for name, entry in _ENTRIES.items()}
)
"""``{name: entry}``: each entry a transformer ``model`` object plus ``source`` (and
``notes`` where the model has parts this one does not)."""

_DESCRIPTIVE = ("source", "notes")


def named_model(name: object) -> JSONObject:
    """The ``model`` fields of a named model (without ``source``/``notes``).

    Raises:
      PlanError: ``unknown_model`` naming the catalog's models.
    """
    entry = MODELS.get(name) if isinstance(name, str) else None
    if entry is None:
        raise PlanError(
            "unknown_model",
            f"model.name {name!r} is not a named model; GET /v1/models lists {sorted(MODELS)}",
        )
    return {k: v for k, v in entry.items() if k not in _DESCRIPTIVE}


def models_json() -> list[JSONObject]:
    """``GET /v1/models`` items: each entry with its ``name``."""
    return [{"name": name, **dict(entry)} for name, entry in MODELS.items()]
