"""Model specs for planning: parameter shapes with paths, FLOPs and activations, no arrays.

Two models, described by plain numbers so a plan for a 70B-parameter model costs
microseconds:

- :class:`MLPSpec`: the built-in MLP of :mod:`datarax.models` (``layers/{i}/kernel``
  ``[f_i, f_{i+1}]`` and ``layers/{i}/bias`` ``[f_{i+1}]``, ReLU between layers).
- :class:`TransformerSpec`: a decoder-only transformer without biases: token embedding
  ``[vocab, d_model]``; per layer RMS-norm scales ``[d_model]``, attention projections
  ``q [d_model, heads * head_dim]``, ``k`` and ``v [d_model, kv_heads * head_dim]``,
  ``o [heads * head_dim, d_model]``, and an MLP (``gated``: ``gate`` and ``up``
  ``[d_model, d_ff]``, ``down [d_ff, d_model]``; ``plain``: ``up`` and ``down``); a final
  norm and an untied unembedding ``[d_model, vocab]``. ``head_dim = d_model // heads``.

Each parameter carries its tensor-parallel role (Megatron-style, Shoeybi et al. 2019,
https://arxiv.org/abs/1909.08053): ``col`` splits the output (last) dimension, ``row``
the input (first) one; ``vocab`` splits the vocabulary dimension; ``replicated`` never
splits over the tensor axis. The MLP's kernels alternate ``col``/``row`` so that a
``[d, f, d]`` MLP is one Megatron block.

Example:
  >>> spec = model_spec({"kind": "transformer", "layers": 2, "d_model": 64, "d_ff": 256,
  ...                    "heads": 4, "kv_heads": 2, "vocab": 100, "seq_len": 16})
  >>> spec.param_count()
  136000
  >>> spec.param_shapes()["layers/1/attn/k"]
  (64, 32)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from datarax.errors import PlanError
from datarax.json_types import JSONObject
from datarax.specs.model_fields import (
    DTYPE_BYTES,
    MAXTEXT_REMAT,
    MLA_FIELDS,
    MLP_REMAT,
    MOE_FIELDS,
    REMAT_POLICIES,
    REMAT_TENSORS,
    check_choice,
    check_dtype,
    transformer_fields,
)
from datarax.specs.named_model_figures import named_model

__all__ = [
    "DTYPE_BYTES",
    "MLPSpec",
    "ModelSpec",
    "ParamGroup",
    "TransformerSpec",
    "MAXTEXT_REMAT",
    "MLA_FIELDS",
    "MOE_FIELDS",
    "REMAT_POLICIES",
    "REMAT_TENSORS",
    "model_spec",
]


@dataclass(frozen=True)
class ParamGroup:
    """One parameter, or ``repeat`` same-shaped ones (one per transformer layer).

    Attributes:
      path: ``"layers/0/kernel"``; repeated groups write ``"layers/*/attn/q"``.
      shape: the parameter's shape.
      tensor: tensor-parallel role: ``col``, ``row``, ``vocab`` or ``replicated``.
      repeat: how many such parameters the model has.
      matmul: whether each token multiplies through it (counts in ``6 * N`` FLOPs).
      expert: the group stacks the routed experts of mixture-of-experts layers on its
        first dimension (``[experts, ...]``): the ``expert`` axes split that dimension,
        and a token multiplies through ``experts_per_token`` of them only.
    """

    path: str
    shape: tuple[int, ...]
    tensor: str
    repeat: int = 1
    matmul: bool = True
    expert: bool = False

    @property
    def size(self) -> int:
        return math.prod(self.shape) * self.repeat

    def tensor_dim(self) -> int | None:
        """Dimension the tensor axis splits, or ``None``."""
        if self.tensor == "col":
            return len(self.shape) - 1
        if self.tensor == "row":  # [.., in, out]: the input dimension
            return len(self.shape) - 2
        if self.tensor == "vocab":
            # embedding [vocab, d] splits dim 0; unembedding [d, vocab] its last dim
            return 0 if self.path.startswith("embed") else len(self.shape) - 1
        return None


class _SpecBase:
    """What both specs share: parameter listings derived from ``params()``."""

    def params(self) -> list[ParamGroup]:  # pragma: no cover - overridden
        raise NotImplementedError

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """``{path: shape}`` of every parameter, layers expanded (``layers/3/attn/q``)."""
        shapes: dict[str, tuple[int, ...]] = {}
        for group in self.params():
            if "*" in group.path:
                for i in range(group.repeat):
                    shapes[group.path.replace("*", str(i))] = group.shape
            else:
                shapes[group.path] = group.shape
        return shapes

    def param_count(self) -> int:
        """All parameters."""
        return sum(g.size for g in self.params())


@dataclass(frozen=True)
class MLPSpec(_SpecBase):
    """The built-in MLP: ``features = [in, hidden..., out]``, one example = one token.

    Attributes:
      features: widths.
      dtype: parameter, optimizer-state and activation dtype.
      remat: ``none`` keeps every layer's activations for the backward pass; ``full``
        keeps only the input and recomputes the rest.
      loss: ``mse`` (targets ``[B, out]`` float) or ``cross_entropy`` (``[B]`` int32).
    """

    features: tuple[int, ...]
    dtype: str = "float32"
    remat: str = "none"
    loss: str = "mse"

    kind = "mlp"

    def params(self) -> list[ParamGroup]:
        groups = []
        for i, (a, b) in enumerate(zip(self.features[:-1], self.features[1:], strict=True)):
            role = "col" if i % 2 == 0 else "row"
            groups.append(ParamGroup(f"layers/{i}/kernel", (a, b), role))
            # a row-parallel layer's bias is added after the reduction: replicated
            groups.append(
                ParamGroup(f"layers/{i}/bias", (b,), "col" if role == "col" else "replicated")
            )
        return groups

    @property
    def tokens_per_example(self) -> int:
        return 1

    def matmul_params(self) -> int:
        """Parameters counted in ``6 * N`` (kernels and biases: the book's ``params``)."""
        return sum(g.size for g in self.params())

    def attention_flops_per_token(self) -> int:
        return 0

    def batch_bytes_per_example(self) -> int:
        """Bytes of one example's inputs and targets (float32 / int32, as ``synthetic_batch``)."""
        targets = 4 if self.loss == "cross_entropy" else 4 * self.features[-1]
        return 4 * self.features[0] + targets

    def batch_shape(self, global_batch: int) -> list[int]:
        return [global_batch, self.features[0]]

    def activation_elements_per_token(self, tensor: int) -> float:
        """Elements saved for the backward pass per example, one device, ``tensor``-way.

        ``none``: each layer's input and each hidden pre-activation (ReLU's mask is
        recomputed from it); a ``col`` layer's output is split over ``tensor``, its input
        (a ``row`` layer's output after the all-reduce) is whole. ``full``: the input only.
        """
        if self.remat == "full":
            return float(self.features[0])
        total = 0.0
        for i, width in enumerate(self.features[1:]):
            split = tensor if i % 2 == 0 else 1
            total += width / split
        return total + self.features[0]

    def to_json(self) -> JSONObject:
        return {
            "kind": "mlp",
            "features": list(self.features),
            "dtype": self.dtype,
            "remat": self.remat,
            "loss": self.loss,
        }


@dataclass(frozen=True)
class TransformerSpec(_SpecBase):
    """A decoder-only transformer (see the module docstring for its parameters).

    Field names and defaults follow MaxText's ``base.yml`` (commit
    ``8cbea6617945cdcb0e1dd54b1d842a1dedb9a19e``), translated to this API's names:

    Attributes:
      layers, d_model, d_ff, heads, kv_heads, vocab, seq_len: sizes (MaxText's
        ``base_num_decoder_layers``, ``base_emb_dim``, ``base_mlp_dim``,
        ``base_num_query_heads``, ``base_num_kv_heads``, ``vocab_size``,
        ``max_target_length``).
      mlp: ``gated`` (SwiGLU, MaxText's ``mlp_activations: [silu, linear]``: three
        matrices) or ``plain`` (one activation, ``[gelu]``: two matrices).
      dtype: compute and activation dtype (MaxText's ``dtype``, default bfloat16).
      remat: a MaxText ``remat_policy`` name (:data:`MAXTEXT_REMAT`); ``full`` keeps each
        layer's input only and recomputes the rest.
      param_dtype: parameters, gradients and optimizer moments (MaxText's
        ``weight_dtype``; its default there is float32, here ``dtype`` as DESIGN v1.2
        fixes it). Matmuls cast the weights to ``dtype``.
      head_dim: per-head width (MaxText's ``head_dim``; default ``d_model // heads``).
      tied_embeddings: the unembedding is the embedding's transpose (MaxText's
        ``logits_via_embedding``, default false).
      attention: ``flash`` (a fused kernel: Pallas splash attention on TPU, cuDNN on GPU,
        no ``[S, S]`` scores in HBM, the causal half skipped; MaxText's ``attention:
        flash``/``autoselected``) or ``dot`` (``softmax(QK^T)V`` materialized, MaxText's
        ``dot_product``).
      vocab_tiling: MaxText's ``num_vocab_tiling``: the loss is computed over this many
        token chunks, so only one chunk's logits are live (default 1).
      remat_custom: ``((tensor, place), ...)`` for ``remat: custom`` (MaxText's per-tensor
        keys ``decoder_layer_input: offload`` ...); places ``device``, ``offload``,
        ``remat``.
      name: the catalog entry this spec came from (``llama3.1-8b``), if any.
      num_experts: routed experts of each mixture-of-experts layer (MaxText's
        ``num_experts``); 0 or 1: a dense model.
      experts_per_token: experts each token is routed to (``num_experts_per_tok``).
      shared_experts: experts every token goes through besides the routed ones
        (``shared_experts``; DeepSeek), one gated MLP ``shared_experts * moe_d_ff`` wide.
      moe_d_ff: one expert's hidden width (``base_moe_mlp_dim``; default ``d_ff``).
      first_dense_layers: leading layers with a dense MLP (``first_num_dense_layers``).
      moe_every: every ``moe_every``-th layer after those is a mixture-of-experts layer,
        the others dense (``interleave_moe_layer_step``; Llama 4 Maverick: 2).
      capacity_factor: tokens an expert takes, as a multiple of its even share
        (``capacity_factor``); 0 or less: dropless (every routed token is computed).
      moe_kernel: ``sparse`` (grouped matmul over tokens sorted by expert, MaxText's
        ``sparse_matmul`` with megablox or ``ragged_dot``) or ``dense`` (a
        capacity-padded einsum, MaxText's ``sparse_matmul: false``).
      attention_type: ``mha`` (grouped by ``kv_heads``) or ``mla`` (DeepSeek's
        multi-head latent attention: queries through a ``q_lora_rank`` bottleneck when it
        is over 0, keys and values through a ``kv_lora_rank`` one; query and key heads
        ``qk_nope_head_dim + qk_rope_head_dim`` wide, value heads ``v_head_dim``).
    """

    layers: int
    d_model: int
    d_ff: int
    heads: int
    kv_heads: int
    vocab: int
    seq_len: int
    mlp: str = "gated"
    dtype: str = "bfloat16"
    remat: str = "none"
    param_dtype: str = ""
    head_dim: int = 0
    tied_embeddings: bool = False
    attention: str = "flash"
    vocab_tiling: int = 1
    remat_custom: tuple[tuple[str, str], ...] = ()
    name: str | None = None
    num_experts: int = 0
    experts_per_token: int = 1
    shared_experts: int = 0
    moe_d_ff: int = 0
    first_dense_layers: int = 0
    moe_every: int = 1
    capacity_factor: float = -1.0
    moe_kernel: str = "sparse"
    attention_type: str = "mha"
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    kind = "transformer"

    def __post_init__(self) -> None:
        if not self.param_dtype:
            object.__setattr__(self, "param_dtype", self.dtype)
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.d_model // self.heads)
        if not self.moe_d_ff:
            object.__setattr__(self, "moe_d_ff", self.d_ff)

    @property
    def is_moe(self) -> bool:
        """Whether some layers route tokens to experts (``num_experts`` over 1)."""
        return self.num_experts > 1

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer ``i`` (from 0) is a mixture-of-experts layer: after the
        ``first_dense_layers``, every ``moe_every``-th one (MaxText's
        ``(layer + 1) % interleave_moe_layer_step == 0`` counted from the first
        non-dense layer)."""
        if not self.is_moe or i < self.first_dense_layers:
            return False
        return (i + 1 - self.first_dense_layers) % self.moe_every == 0

    @property
    def moe_layers(self) -> int:
        """How many layers are mixture-of-experts layers (closed form: the count of
        :meth:`is_moe_layer`, without a pass over the layers)."""
        if not self.is_moe:
            return 0
        return max(0, self.layers - self.first_dense_layers) // max(1, self.moe_every)

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    @property
    def qk_head_dim(self) -> int:
        """Width of a query and a key head: ``head_dim``, or MLA's nope plus rope."""
        if self.attention_type == "mla":
            return self.qk_nope_head_dim + self.qk_rope_head_dim
        return self.head_dim

    @property
    def value_head_dim(self) -> int:
        """Width of a value head (and of the attention output per head)."""
        return self.v_head_dim if self.attention_type == "mla" else self.head_dim

    @property
    def ffn_width(self) -> float:
        """The feed-forward hidden width one token goes through, averaged over layers:
        ``d_ff`` in a dense layer, ``(experts_per_token + shared_experts) * moe_d_ff``
        in a mixture-of-experts layer. The activation and time estimates take it where a
        dense model has ``d_ff``; a dense model's is ``d_ff`` exactly."""
        if not self.is_moe:
            return float(self.d_ff)
        routed = (self.experts_per_token + self.shared_experts) * self.moe_d_ff
        return (self.dense_layers * self.d_ff + self.moe_layers * routed) / self.layers

    @property
    def dropless(self) -> bool:
        return self.capacity_factor <= 0

    @property
    def tokens_per_example(self) -> int:
        return self.seq_len

    def remat_places(self) -> dict[str, str] | None:
        """``{tensor: place}`` for every name of :data:`REMAT_TENSORS` under ``remat``
        (``device``, ``offload`` or ``remat``); ``None`` for ``remat: none`` (no
        checkpointing: the autodiff keeps what it needs, :mod:`cost` counts it)."""
        table = MAXTEXT_REMAT[self.remat]
        if table is None:
            return None
        if self.remat == "custom":
            given = dict(self.remat_custom)
            places = {name: given.get(name, "remat") for name in REMAT_TENSORS}
            places["decoder_layer_input"] = given.get("decoder_layer_input", "device")
            return places
        places = {name: table.get(name, "remat") for name in REMAT_TENSORS}
        places["decoder_layer_input"] = "device"
        return places

    def _attention_params(self, prefix: str, n: int) -> list[ParamGroup]:
        d, h = self.d_model, self.heads
        if self.attention_type == "mha":
            hd = self.head_dim
            return [
                ParamGroup(f"{prefix}/attn/q", (d, h * hd), "col", n),
                ParamGroup(f"{prefix}/attn/k", (d, self.kv_heads * hd), "col", n),
                ParamGroup(f"{prefix}/attn/v", (d, self.kv_heads * hd), "col", n),
                ParamGroup(f"{prefix}/attn/o", (h * hd, d), "row", n),
            ]
        # MLA (DeepSeek-V2/V3, MaxText's attention_mla.py): the down projections and their
        # norms are small and stay whole over the tensor axes; the up projections split
        # their heads.
        qk, rank, rope = self.qk_head_dim, self.kv_lora_rank, self.qk_rope_head_dim
        groups = []
        if self.q_lora_rank > 0:
            q = self.q_lora_rank
            groups += [
                ParamGroup(f"{prefix}/attn/wq_a", (d, q), "replicated", n),
                ParamGroup(f"{prefix}/attn/q_norm/scale", (q,), "replicated", n, matmul=False),
                ParamGroup(f"{prefix}/attn/wq_b", (q, h * qk), "col", n),
            ]
        else:
            groups.append(ParamGroup(f"{prefix}/attn/q", (d, h * qk), "col", n))
        return [
            *groups,
            ParamGroup(f"{prefix}/attn/wkv_a", (d, rank + rope), "replicated", n),
            ParamGroup(f"{prefix}/attn/kv_norm/scale", (rank,), "replicated", n, matmul=False),
            ParamGroup(
                f"{prefix}/attn/wkv_b", (rank, h * (self.qk_nope_head_dim + self.v_head_dim)),
                "col", n,
            ),
            ParamGroup(f"{prefix}/attn/o", (h * self.v_head_dim, d), "row", n),
        ]  # fmt: skip

    def _mlp_params(self, path: str, width: int, n: int) -> list[ParamGroup]:
        d = self.d_model
        groups = [ParamGroup(f"{path}/gate", (d, width), "col", n)] if self.mlp == "gated" else []
        return [
            *groups,
            ParamGroup(f"{path}/up", (d, width), "col", n),
            ParamGroup(f"{path}/down", (width, d), "row", n),
        ]

    def _moe_params(self, prefix: str, n: int) -> list[ParamGroup]:
        """A mixture-of-experts layer's parameters (MaxText's ``RoutedMoE``): the router
        ``[d, experts]`` (whole on every device: its logits are needed for every expert),
        the experts' stacked ``wi``/``wo`` kernels ``[experts, d, moe_d_ff]`` and
        ``[experts, moe_d_ff, d]``, and the shared experts as one gated MLP."""
        d, e, f = self.d_model, self.num_experts, self.moe_d_ff
        names = ("wi_0", "wi_1", "wo") if self.mlp == "gated" else ("wi", "wo")
        groups = [ParamGroup(f"{prefix}/moe/router", (d, e), "replicated", n)]
        groups += [
            ParamGroup(
                f"{prefix}/moe/experts/{name}",
                (e, f, d) if name == "wo" else (e, d, f),
                "row" if name == "wo" else "col",
                n,
                expert=True,
            )
            for name in names
        ]
        if self.shared_experts:
            groups += self._mlp_params(f"{prefix}/moe/shared", self.shared_experts * f, n)
        return groups

    def _layer_params(self, prefix: str, n: int, moe: bool) -> list[ParamGroup]:
        d = self.d_model
        return [
            ParamGroup(f"{prefix}/attn_norm/scale", (d,), "replicated", n, matmul=False),
            *self._attention_params(prefix, n),
            ParamGroup(f"{prefix}/mlp_norm/scale", (d,), "replicated", n, matmul=False),
            *(self._moe_params(prefix, n) if moe else self._mlp_params(
                f"{prefix}/mlp", self.d_ff, n)),
        ]  # fmt: skip

    def params(self) -> list[ParamGroup]:
        """The parameter groups. A dense model's layers are one stacked group per
        parameter (``layers/*/...``); a mixture-of-experts model's are two stacks, as
        MaxText scans them: ``dense_layers/*/...`` and ``moe_layers/*/...``."""
        d = self.d_model
        groups = [ParamGroup("embed/embedding", (self.vocab, d), "vocab", matmul=False)]
        if not self.is_moe:
            groups += self._layer_params("layers/*", self.layers, moe=False)
        else:
            if self.dense_layers:
                groups += self._layer_params("dense_layers/*", self.dense_layers, moe=False)
            groups += self._layer_params("moe_layers/*", self.moe_layers, moe=True)
        groups.append(ParamGroup("final_norm/scale", (d,), "replicated", matmul=False))
        if not self.tied_embeddings:
            groups.append(ParamGroup("unembed/kernel", (d, self.vocab), "vocab"))
        return groups

    def _routed_share(self, group: ParamGroup) -> float:
        """The share of a group one token multiplies through: ``experts_per_token /
        num_experts`` for routed experts, else 1."""
        return self.experts_per_token / self.num_experts if group.expert else 1.0

    def matmul_params(self) -> int:
        """Parameters every token multiplies through: all but the embedding and norms
        (a tied embedding counts once, as the unembedding); of the routed experts, the
        ``experts_per_token`` a token goes to."""
        n = sum(round(g.size * self._routed_share(g)) for g in self.params() if g.matmul)
        return n + (self.vocab * self.d_model if self.tied_embeddings else 0)

    def routed_matmul_params(self) -> int:
        """The part of :meth:`matmul_params` in the routed experts (grouped matmuls)."""
        return sum(round(g.size * self._routed_share(g)) for g in self.params() if g.expert)

    def active_param_count(self) -> int:
        """Parameters one token uses, as model cards count "active" ones: all of them
        with the routed experts counted ``experts_per_token`` times, not
        ``num_experts`` (the embedding included). A dense model's is
        :meth:`param_count`."""
        return sum(round(g.size * self._routed_share(g)) for g in self.params())

    def attention_flops_per_token(self) -> int:
        """Training FLOPs of the attention scores per token: ``12 * layers * seq_len *
        heads * head_dim`` (forward ``QK^T`` and ``AV`` are ``2 * S * heads * head_dim``
        each; backward twice the forward). This is the model-FLOPs count MaxText's
        ``calculate_tflops_training_per_device`` uses (non-causal); a ``flash`` kernel
        skips the masked half, which :mod:`cost` prices, not this count. With MLA,
        ``QK^T`` is ``qk_head_dim`` wide and ``AV`` ``v_head_dim``: ``6 * layers *
        seq_len * heads * (qk + v)``."""
        qk_v = self.qk_head_dim + self.value_head_dim
        return 6 * self.layers * self.seq_len * self.heads * qk_v

    def batch_bytes_per_example(self) -> int:
        """Token ids and next-token targets, int32: ``8 * seq_len`` bytes."""
        return 8 * self.seq_len

    def batch_shape(self, global_batch: int) -> list[int]:
        return [global_batch, self.seq_len]

    def named_elements_per_token(self, tensor: int) -> dict[str, float]:
        """Elements per token of each of MaxText's named tensors of one layer, on one
        device, ``tensor``-way. The residual stream (``d``-wide: the layer input and the
        out projection) is split over the tensor axes too, as MaxText's
        ``activation_embed`` rule shards it (Megatron's sequence parallelism, Korthikanti
        et al. 2022). (``mlpwo`` and ``qkv_proj`` are 0: this model does not fuse
        q/k/v, and the down projection's output only enters the residual sum, so the
        backward pass never reads it. The MLP's input projections are ``mlpwi_0`` and
        ``mlpwi_1`` when gated, ``mlpwi`` when plain, as MaxText names one activation's
        ``wi``.)"""
        d, f, t = self.d_model, self.ffn_width, tensor
        qk, v = self.qk_head_dim, self.value_head_dim
        return {
            "decoder_layer_input": d / t,
            "query_proj": self.heads * qk / t,
            "key_proj": self.kv_heads * qk / t,
            "value_proj": self.kv_heads * v / t,
            "qkv_proj": 0.0,
            "context": self.heads * v / t,
            "out_proj": d / t,
            "mlpwi": 0.0 if self.mlp == "gated" else f / t,
            "mlpwi_0": f / t if self.mlp == "gated" else 0.0,
            "mlpwi_1": f / t if self.mlp == "gated" else 0.0,
            "mlpwo": 0.0,
        }

    def layer_elements_per_token(self, tensor: int) -> float:
        """One layer's textbook activations per token at ``remat: none``, one device,
        ``tensor``-way (see :meth:`activation_elements_per_token`)."""
        d, f, s = self.d_model, self.ffn_width, self.seq_len
        qk, v = self.qk_head_dim, self.value_head_dim
        mlp_hidden = (3 if self.mlp == "gated" else 2) * f
        scores = self.heads * s if self.attention == "dot" else 0
        attention = (self.heads + self.kv_heads) * qk + (self.kv_heads + self.heads) * v
        return (4 * d + attention + scores + mlp_hidden) / tensor

    def activation_elements_per_token(self, tensor: int) -> float:
        """Elements saved for the backward pass per token, one device, ``tensor``-way.

        ``none``, per layer (``t = tensor``; everything split over it: heads and
        ``d_ff`` as Megatron splits them, the ``d``-wide residual stream as MaxText's
        ``activation_embed`` rule and Megatron's sequence parallelism do): the two norm
        inputs ``2 d`` and outputs ``2 d``;
        ``q, k, v`` ``(heads + 2 kv_heads) hd / t``; softmax probabilities
        ``heads * S / t`` (``dot`` attention only); attention output ``heads hd / t``;
        MLP hidden ``3 f / t`` (gated: gate, up, their product) or ``2 f / t`` (plain:
        pre- and post-activation); plus, once, the logits ``vocab / t`` and the final norm
        ``d``. Without dropout and with a plain ``f = 4d`` MLP this is Korthikanti et al.
        2022 (https://arxiv.org/abs/2205.05198, eq. 2: ``sbh(34 + 5as/h)`` bytes at 16
        bits) minus its dropout masks and outputs. Other policies: the named tensors kept
        on the device (:meth:`remat_places`) per layer, plus one layer's ``none``
        activations while it is recomputed.
        """
        layer = self.layer_elements_per_token(tensor)
        head = (self.vocab + self.d_model) / tensor
        places = self.remat_places()
        if places is None:
            return self.layers * layer + head
        sizes = self.named_elements_per_token(tensor)
        kept = sum(sizes[name] for name, where in places.items() if where == "device")
        return self.layers * kept + layer + head

    def to_json(self) -> JSONObject:
        out: dict[str, Any] = {
            "kind": "transformer",
            "layers": self.layers,
            "d_model": self.d_model,
            "d_ff": self.d_ff,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "vocab": self.vocab,
            "seq_len": self.seq_len,
            "mlp": self.mlp,
            "dtype": self.dtype,
            "remat": self.remat,
            "param_dtype": self.param_dtype,
            "head_dim": self.head_dim,
            "tied_embeddings": self.tied_embeddings,
            "attention": self.attention,
            "vocab_tiling": self.vocab_tiling,
        }
        if self.remat == "custom":
            out["remat_custom"] = dict(self.remat_custom)
        if self.is_moe:
            out.update({key: getattr(self, key) for key in MOE_FIELDS})
        if self.attention_type == "mla":
            out.update({key: getattr(self, key) for key in MLA_FIELDS})
        if self.name is not None:
            out["name"] = self.name
        return out


ModelSpec = MLPSpec | TransformerSpec


def model_spec(
    model: Mapping[str, Any] | ModelSpec, *, default_dtype: str = "bfloat16"
) -> ModelSpec:
    """A checked spec from a plan request's ``model`` object (a spec passes through).

    Args:
      model: ``{"kind": "mlp", "features": [...]}``, ``{"kind": "transformer",
        "layers", "d_model", "d_ff", "heads", "kv_heads", "vocab", "seq_len"}`` (with the
        optional fields of :class:`TransformerSpec`) or ``{"name": "llama3.1-8b",
        ...overrides}``, a named model of :data:`datarax.specs.named_models.MODELS`
        whose fields the other keys replace; all with optional ``dtype`` and ``remat``.
      default_dtype: dtype when the request gives none (``bfloat16`` for hardware plans).

    Raises:
      PlanError: code ``invalid_model`` naming the field and what is accepted;
        ``unknown_model`` for a name the catalog does not have.
    """
    if isinstance(model, MLPSpec | TransformerSpec):
        return model
    if not isinstance(model, Mapping):
        raise PlanError("invalid_model", f"model must be an object with a kind, got {model!r}")
    name = model.get("name")
    if name is not None:
        given = {k: v for k, v in model.items() if k != "name"}
        entry = named_model(name)
        if "head_dim" not in given and given.keys() & set(MLA_FIELDS):
            entry.pop("head_dim", None)  # MLA's heads are nope + rope wide, as given
        model = {**entry, **given}
    kind = model.get("kind")
    dtype = check_dtype(model.get("dtype"), default_dtype)
    if kind == "mlp":
        remat = check_choice(model, "remat", MLP_REMAT, "none")
        features = model.get("features")
        if (
            not isinstance(features, list | tuple)
            or len(features) < 2
            or any(isinstance(f, bool) or not isinstance(f, int) or f < 1 for f in features)
        ):
            raise PlanError(
                "invalid_model",
                f"model.features must list at least 2 positive widths, got {features!r}",
            )
        loss = model.get("loss", "mse")
        if loss not in ("mse", "cross_entropy"):
            raise PlanError("invalid_model", f"model.loss {loss!r} is not 'mse' or 'cross_entropy'")
        return MLPSpec(tuple(int(f) for f in features), dtype, remat, loss)
    if kind == "transformer":
        return TransformerSpec(**transformer_fields(model, dtype), name=name)
    raise PlanError("invalid_model", f"model.kind {kind!r} is not 'mlp' or 'transformer'")
