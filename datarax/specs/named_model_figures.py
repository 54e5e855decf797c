"""The named models' figures: the decoder-only transformers people train, dense and
mixture-of-experts, as plan requests take them (the catalog's answers, with their
parameter counts, are :data:`datarax.specs.named_models.MODELS`; these figures sit below
:mod:`datarax.specs.model_specs`, which resolves a name through :func:`named_model`).

Each entry is a ``model`` object of DESIGN v1.2 (``{"kind": "transformer", ...}``) plus a
``source``; ``{"name": "llama3.1-8b", "remat": "full"}`` in a request is the entry with
its ``remat`` replaced (:func:`datarax.specs.model_specs.model_spec`).

Figures come from MaxText's ``MaxText/configs/models/<name>.yml`` (repository
AI-Hypercomputer/maxtext; the commit read is in each ``source``), which takes them from
the model cards. ``seq_len`` is the length the family was pre-trained with (the model card),
not MaxText's ``max_target_length`` default (2048): the length priced where a request has
no ``batch_shape`` (a recommendation's ``global_batch`` sequences are this long); a
hardware plan's sequences are its ``batch_shape[1]``. What this model does not have, and the
entry's ``notes`` say where it matters: Gemma 2's alternating local/global attention, its
extra post-norms and logit soft-capping; Mistral's sliding window; GPT-3's learned positions
and biases. None of them change the parameter count by more than 0.1% or the FLOPs of the
matmuls.

The mixture-of-experts models (Mixtral, DeepSeek-V3, Qwen3's MoE, Llama 4, gpt-oss) come
from ``src/maxtext/configs/models/<name>.yml`` at one MaxText commit (each ``source``
names it) and carry the MoE fields (``num_experts``, ``experts_per_token``, ``shared_experts``,
``moe_d_ff``, ``first_dense_layers``, ``moe_every``) and, for DeepSeek-V3, MLA's
(``attention_type: mla`` ...). ``capacity_factor`` and ``moe_kernel`` are left to their
defaults (dropless, sparse), as MaxText's ``base.yml`` leaves them. Each source also names
the model card or paper whose total and active parameter counts the entry reproduces
(within 2%), and ``notes`` lists what the model has that is not priced here.

Example:
  >>> named_model("llama3.1-8b")["d_ff"]
  14336
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from datarax.errors import PlanError
from datarax.json_types import JSONObject
from datarax.names import did_you_mean

__all__ = ["FIGURES", "named_model"]

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


def _moe(
    experts: int,
    per_token: int,
    moe_f: int,
    *,
    shared: int = 0,
    first_dense: int = 0,
    every: int = 1,
) -> JSONObject:
    """MaxText's ``num_experts``, ``num_experts_per_tok``, ``base_moe_mlp_dim``,
    ``shared_experts``, ``first_num_dense_layers`` and ``interleave_moe_layer_step``."""
    return {
        "num_experts": experts,
        "experts_per_token": per_token,
        "shared_experts": shared,
        "moe_d_ff": moe_f,
        "first_dense_layers": first_dense,
        "moe_every": every,
    }


# The MaxText commit the mixture-of-experts entries were read at (its configs moved to
# src/maxtext/configs/models/ after the dense entries' commits).
_MT_MOE = "e591f30cbbf217ed67ef71263ec0538239f9c3b8"


def _moe_src(name: str, card: str) -> str:
    return f"{_MT}/{_MT_MOE}/src/maxtext/configs/models/{name}.yml; {card}"


_MIXTRAL_NOTES = (
    "router: softmax over the top-2 of 8 expert logits, unpriced; attention is full "
    "causal, as Mixtral has it (no sliding window)"
)
_QWEN3_NOTES = (
    "QK-norm (an RMSNorm on each query and key head, 2*128 scales a layer) is not "
    "counted; router: softmax, the top-8 weights renormalized (norm_topk_prob), unpriced; "
    "no shared expert"
)
_QWEN3_CARD = (
    "Qwen3 technical report (Qwen Team 2025, https://arxiv.org/abs/2505.09388): general "
    "pre-training stage on 4,096-token sequences, then a 32,768-token long-context stage"
)
_LLAMA4_CONTEXT = (
    "Meta does not publish the main pre-training stage's sequence length: 8192 is the "
    "chunked-attention window (MaxText's chunk_attn_window_size); Meta's Llama 4 blog "
    "(https://ai.meta.com/blog/llama-4-multimodal-intelligence/) reports 256K for Scout's "
    "training, the long-context extension being part of mid-training"
)


def _llama4_notes(qk_norm: str, gap: str) -> str:
    return (
        "the vision encoder (a 34-layer ViT 1408 wide with its adapter and projector, "
        f"about 0.9B) is not counted, though the card's total seems to include it ({gap}); "
        "three layers in "
        "four attend within 8192-token chunks with RoPE and the fourth globally without "
        "RoPE (iRoPE), priced here as causal attention over the whole sequence; inference "
        f"temperature tuning is not modelled; {qk_norm}; router: sigmoid, 1 expert a "
        "token, plus the shared expert every token goes through"
    )


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
    # ------------------------------------------------------------ mixture of experts
    "mixtral-8x7b": {
        **_llama(32, 4096, 14336, 32, 8, 32000, 32768),
        **_moe(8, 2, 14336),
        "source": _moe_src(
            "mixtral-8x7b",
            "Mistral AI's announcement (https://mistral.ai/news/mixtral-of-experts): 46.7B "
            "parameters, 12.9B used per token; Mixtral paper (Jiang et al. 2024, "
            "https://arxiv.org/abs/2401.04088): trained with a 32k context",
        ),
        "notes": _MIXTRAL_NOTES,
    },
    "mixtral-8x22b": {
        **_llama(56, 6144, 16384, 48, 8, 32768, 65536),
        **_moe(8, 2, 16384),
        "source": _moe_src(
            "mixtral-8x22b",
            "Mistral AI's announcement (https://mistral.ai/news/mixtral-8x22b): 141B "
            "parameters, 39B active, a 64k context window (the training length is not "
            "published); model card https://huggingface.co/mistralai/Mixtral-8x22B-v0.1",
        ),
        "notes": _MIXTRAL_NOTES,
    },
    "deepseek3-671b": {
        **_llama(61, 7168, 18432, 128, 128, 129280, 4096),
        "head_dim": 192,
        **_moe(256, 8, 2048, shared=1, first_dense=3),
        "attention_type": "mla",
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "source": _moe_src(
            "deepseek3-671b",
            "DeepSeek-V3 technical report (DeepSeek-AI 2024, https://arxiv.org/abs/2412.19437): "
            "671B parameters, 37B activated per token, pre-trained on 4K sequences; model "
            "card https://huggingface.co/deepseek-ai/DeepSeek-V3 (its 685B adds the 14B "
            "multi-token prediction module)",
        ),
        "notes": "the multi-token prediction module (one more MoE layer and a projection "
        "trained with the model and dropped for inference; 14B in the checkpoint with its "
        "copies of the shared embedding and output head) is neither counted nor priced; "
        "router: sigmoid scores plus a per-expert bias for balancing (no auxiliary loss), "
        "top-8 of 256 from at most 4 of 8 groups, weights scaled by 2.5, unpriced; YaRN "
        "RoPE on the 64-wide decoupled rope part of each head",
    },
    "qwen3-30b-a3b": {
        **_llama(48, 2048, 768, 32, 4, 151936, 4096),
        "head_dim": 128,
        **_moe(128, 8, 768),
        "source": _moe_src(
            "qwen3-30b-a3b",
            "model card https://huggingface.co/Qwen/Qwen3-30B-A3B: 30.5B parameters, 3.3B "
            f"activated; {_QWEN3_CARD}",
        ),
        "notes": _QWEN3_NOTES,
    },
    "qwen3-235b-a22b": {
        **_llama(94, 4096, 1536, 64, 4, 151936, 4096),
        "head_dim": 128,
        **_moe(128, 8, 1536),
        "source": _moe_src(
            "qwen3-235b-a22b",
            "model card https://huggingface.co/Qwen/Qwen3-235B-A22B: 235B parameters, 22B "
            f"activated; {_QWEN3_CARD}",
        ),
        "notes": _QWEN3_NOTES,
    },
    "llama4-17b-16e": {
        **_llama(48, 5120, 8192, 40, 8, 202048, 8192),
        **_moe(16, 1, 8192, shared=1),
        "source": _moe_src(
            "llama4-17b-16e",
            "model card https://huggingface.co/meta-llama/Llama-4-Scout-17B-16E (Llama 4 "
            f"Scout): 109B parameters, 17B active; {_LLAMA4_CONTEXT}",
        ),
        "notes": _llama4_notes(
            "QK L2-norm (no parameters) is not modelled", "107.8B here against its 109B"
        ),
    },
    "llama4-17b-128e": {
        **_llama(48, 5120, 16384, 40, 8, 202048, 8192),
        **_moe(128, 1, 8192, shared=1, every=2),
        "source": _moe_src(
            "llama4-17b-128e",
            "model card https://huggingface.co/meta-llama/Llama-4-Maverick-17B-128E (Llama 4 "
            f"Maverick): 400B parameters, 17B active; {_LLAMA4_CONTEXT}",
        ),
        "notes": "dense layers (MLP 16384 wide) alternate with mixture-of-experts ones; "
        + _llama4_notes("no QK norm", "400.7B here against its round 400B"),
    },
    "gpt-oss-120b": {
        **_llama(36, 2880, 2880, 64, 8, 201088, 4096),
        "head_dim": 64,
        **_moe(128, 4, 2880),
        "source": _moe_src(
            "gpt-oss-120b",
            "gpt-oss-120b & gpt-oss-20b model card (OpenAI 2025, "
            "https://arxiv.org/abs/2508.10925; https://huggingface.co/openai/gpt-oss-120b): "
            "116.83B parameters, 5.13B active, the active count leaving out the embedding "
            "table; pre-trained at 4,096 tokens (original_max_position_embeddings; YaRN "
            "scales it 32 times to 131,072)",
        ),
        "notes": "the card's 5.13B active leaves out the embedding table (201088*2880, "
        "0.58B), which the active count here includes (5.71B); every other layer attends "
        "within a 128-token sliding window, priced as full causal attention; learned "
        "attention sinks (one logit a head), the biases of q/k/v/o, the router and the "
        "experts (0.04B, 0.03%) are neither counted nor priced; experts' SwiGLU is clamped "
        "(limit 7) with a sigmoid(1.702x) gate and 1 added to the linear half, priced as a "
        "plain gated MLP; router: softmax over the top-4 of 128 logits, unpriced",
    },
}


FIGURES: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {name: MappingProxyType({"name": name, **entry}) for name, entry in _ENTRIES.items()}
)
"""``{name: figures}``: each named model's ``model`` object with its ``name``, ``source``
(and ``notes`` where the model has parts this one does not), read-only."""

_DESCRIPTIVE = ("name", "source", "notes")


def named_model(name: object) -> JSONObject:
    """The ``model`` fields of a named model (without ``name``, ``source`` and
    ``notes``).

    Raises:
      PlanError: ``unknown_model`` naming the catalog's models.
    """
    entry = FIGURES.get(name) if isinstance(name, str) else None
    if entry is None:
        raise PlanError(
            "unknown_model",
            f"model.name {name!r} is not a named model{did_you_mean(name, FIGURES)}; "
            f"GET /v1/models lists {sorted(FIGURES)}",
        )
    return {k: v for k, v in entry.items() if k not in _DESCRIPTIVE}
