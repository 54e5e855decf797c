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

from datarax.distributed.errors import PlanError
from datarax.estimate.named_models import named_model
from datarax.json_types import JSONObject

__all__ = [
    "DTYPE_BYTES",
    "MLPSpec",
    "ModelSpec",
    "ParamGroup",
    "TransformerSpec",
    "MAXTEXT_REMAT",
    "REMAT_POLICIES",
    "REMAT_TENSORS",
    "model_spec",
]

DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per element of the dtypes a model spec accepts."""

MLP_REMAT: tuple[str, ...] = ("none", "full")


@dataclass(frozen=True)
class ParamGroup:
    """One parameter, or ``repeat`` same-shaped ones (one per transformer layer).

    Attributes:
      path: ``"layers/0/kernel"``; repeated groups write ``"layers/*/attn/q"``.
      shape: the parameter's shape.
      tensor: tensor-parallel role: ``col``, ``row``, ``vocab`` or ``replicated``.
      repeat: how many such parameters the model has.
      matmul: whether each token multiplies through it (counts in ``6 * N`` FLOPs).
    """

    path: str
    shape: tuple[int, ...]
    tensor: str
    repeat: int = 1
    matmul: bool = True

    @property
    def size(self) -> int:
        return math.prod(self.shape) * self.repeat

    def tensor_dim(self) -> int | None:
        """Dimension the tensor axis splits, or ``None``."""
        if self.tensor == "col":
            return len(self.shape) - 1
        if self.tensor == "row":
            return 0
        if self.tensor == "vocab":
            # embedding [vocab, d] splits dim 0; unembedding [d, vocab] its last dim
            return 0 if self.path.startswith("embed") else len(self.shape) - 1
        return None


def _positive_int(spec: Mapping[str, Any], key: str) -> int:
    value = spec.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(
            "invalid_model",
            f"model.{key} must be a positive integer, got {value!r}",
        )
    return value


def _dtype(value: object, default: str) -> str:
    value = default if value is None else value
    if value not in DTYPE_BYTES:
        raise PlanError(
            "invalid_model", f"model.dtype {value!r} is not one of {sorted(DTYPE_BYTES)}"
        )
    return str(value)


def _choice(model: Mapping[str, Any], key: str, allowed: tuple[str, ...], default: str) -> str:
    value = model.get(key)
    value = default if value is None else value
    if value not in allowed:
        raise PlanError("invalid_model", f"model.{key} {value!r} is not one of {list(allowed)}")
    return str(value)


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

    kind = "transformer"

    def __post_init__(self) -> None:
        if not self.param_dtype:
            object.__setattr__(self, "param_dtype", self.dtype)
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.d_model // self.heads)

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

    def params(self) -> list[ParamGroup]:
        d, f, hd, n = self.d_model, self.d_ff, self.head_dim, self.layers
        groups = [ParamGroup("embed/embedding", (self.vocab, d), "vocab", matmul=False)]
        per_layer = [
            ParamGroup("layers/*/attn_norm/scale", (d,), "replicated", n, matmul=False),
            ParamGroup("layers/*/attn/q", (d, self.heads * hd), "col", n),
            ParamGroup("layers/*/attn/k", (d, self.kv_heads * hd), "col", n),
            ParamGroup("layers/*/attn/v", (d, self.kv_heads * hd), "col", n),
            ParamGroup("layers/*/attn/o", (self.heads * hd, d), "row", n),
            ParamGroup("layers/*/mlp_norm/scale", (d,), "replicated", n, matmul=False),
        ]
        if self.mlp == "gated":
            per_layer.append(ParamGroup("layers/*/mlp/gate", (d, f), "col", n))
        per_layer += [
            ParamGroup("layers/*/mlp/up", (d, f), "col", n),
            ParamGroup("layers/*/mlp/down", (f, d), "row", n),
        ]
        head = [ParamGroup("final_norm/scale", (d,), "replicated", matmul=False)]
        if not self.tied_embeddings:
            head.append(ParamGroup("unembed/kernel", (d, self.vocab), "vocab"))
        return [*groups, *per_layer, *head]

    def matmul_params(self) -> int:
        """Parameters every token multiplies through: all but the embedding and norms
        (a tied embedding counts once, as the unembedding)."""
        n = sum(g.size for g in self.params() if g.matmul)
        return n + (self.vocab * self.d_model if self.tied_embeddings else 0)

    def attention_flops_per_token(self) -> int:
        """Training FLOPs of the attention scores per token: ``12 * layers * seq_len *
        heads * head_dim`` (forward ``QK^T`` and ``AV`` are ``2 * S * heads * head_dim``
        each; backward twice the forward). This is the model-FLOPs count MaxText's
        ``calculate_tflops_training_per_device`` uses (non-causal); a ``flash`` kernel
        skips the masked half, which :mod:`cost` prices, not this count."""
        return 12 * self.layers * self.seq_len * self.heads * self.head_dim

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
        d, f, hd, t = self.d_model, self.d_ff, self.head_dim, tensor
        return {
            "decoder_layer_input": d / t,
            "query_proj": self.heads * hd / t,
            "key_proj": self.kv_heads * hd / t,
            "value_proj": self.kv_heads * hd / t,
            "qkv_proj": 0.0,
            "context": self.heads * hd / t,
            "out_proj": d / t,
            "mlpwi": 0.0 if self.mlp == "gated" else f / t,
            "mlpwi_0": f / t if self.mlp == "gated" else 0.0,
            "mlpwi_1": f / t if self.mlp == "gated" else 0.0,
            "mlpwo": 0.0,
        }

    def layer_elements_per_token(self, tensor: int) -> float:
        """One layer's textbook activations per token at ``remat: none``, one device,
        ``tensor``-way (see :meth:`activation_elements_per_token`)."""
        d, f, hd, s = self.d_model, self.d_ff, self.head_dim, self.seq_len
        mlp_hidden = (3 if self.mlp == "gated" else 2) * f
        scores = self.heads * s if self.attention == "dot" else 0
        attention = (self.heads + 2 * self.kv_heads) * hd + self.heads * hd
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
        ...overrides}``, a named model of :data:`datarax.estimate.named_models.MODELS`
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
        model = {**named_model(name), **{k: v for k, v in model.items() if k != "name"}}
    kind = model.get("kind")
    dtype = _dtype(model.get("dtype"), default_dtype)
    if kind == "mlp":
        remat = _choice(model, "remat", MLP_REMAT, "none")
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
        return _transformer_spec(model, dtype, name)
    raise PlanError("invalid_model", f"model.kind {kind!r} is not 'mlp' or 'transformer'")


def _transformer_spec(model: Mapping[str, Any], dtype: str, name: str | None) -> TransformerSpec:
    sizes = {
        key: _positive_int(model, key)
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
        head_dim = _positive_int(model, "head_dim")
    if sizes["heads"] % sizes["kv_heads"]:
        raise PlanError(
            "invalid_model",
            f"model.heads {sizes['heads']} is not a multiple of kv_heads "
            f"{sizes['kv_heads']}; choose kv_heads dividing heads",
        )
    mlp = _choice(model, "mlp", ("gated", "plain"), "gated")
    remat = _choice(model, "remat", REMAT_POLICIES, "none")
    attention = _choice(model, "attention", ATTENTION_KINDS, "flash")
    param_dtype = _dtype(model.get("param_dtype"), dtype)
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
    return TransformerSpec(
        **sizes,
        mlp=mlp,
        dtype=dtype,
        remat=remat,
        param_dtype=param_dtype,
        head_dim=head_dim,
        tied_embeddings=tied,
        attention=attention,
        vocab_tiling=tiling,
        remat_custom=tuple(sorted(custom.items())),
        name=name,
    )
