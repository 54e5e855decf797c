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

from datarax.distributed.planning import PlanError

__all__ = [
    "DTYPE_BYTES",
    "MLPSpec",
    "ModelSpec",
    "ParamGroup",
    "TransformerSpec",
    "model_spec",
]

DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per element of the dtypes a model spec accepts."""

REMAT_POLICIES: tuple[str, ...] = ("none", "full")


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


def _remat(value: object) -> str:
    value = "none" if value is None else value
    if value not in REMAT_POLICIES:
        raise PlanError(
            "invalid_model", f"model.remat {value!r} is not one of {list(REMAT_POLICIES)}"
        )
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

    def to_json(self) -> dict[str, Any]:
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

    Attributes:
      layers, d_model, d_ff, heads, kv_heads, vocab, seq_len: sizes.
      mlp: ``gated`` (SwiGLU-style, three matrices) or ``plain`` (two).
      dtype: parameter, optimizer-state and activation dtype.
      remat: ``none`` or ``full`` (keep each layer's input only; recompute the rest).
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

    kind = "transformer"

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def tokens_per_example(self) -> int:
        return self.seq_len

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
        return [
            *groups,
            *per_layer,
            ParamGroup("final_norm/scale", (d,), "replicated", matmul=False),
            ParamGroup("unembed/kernel", (d, self.vocab), "vocab"),
        ]

    def matmul_params(self) -> int:
        """Parameters every token multiplies through: all but the embedding and norms."""
        return sum(g.size for g in self.params() if g.matmul)

    def attention_flops_per_token(self) -> int:
        """Training FLOPs of the attention scores per token: ``12 * layers * seq_len *
        heads * head_dim`` (forward ``QK^T`` and ``AV`` are ``2 * S * heads * head_dim``
        each; backward twice the forward). The causal mask is not exploited: a plain
        ``softmax(QK^T)V`` computes the masked half too."""
        return 12 * self.layers * self.seq_len * self.heads * self.head_dim

    def batch_bytes_per_example(self) -> int:
        """Token ids and next-token targets, int32: ``8 * seq_len`` bytes."""
        return 8 * self.seq_len

    def batch_shape(self, global_batch: int) -> list[int]:
        return [global_batch, self.seq_len]

    def activation_elements_per_token(self, tensor: int) -> float:
        """Elements saved for the backward pass per token, one device, ``tensor``-way.

        ``none``, per layer (``t = tensor``; heads and ``d_ff`` split over it, the
        residual stream whole): the two norm inputs ``2 d`` and outputs ``2 d``;
        ``q, k, v`` ``(heads + 2 kv_heads) hd / t``; softmax probabilities
        ``heads * S / t``; attention output ``heads hd / t``; MLP hidden ``3 f / t``
        (gated: gate, up, their product) or ``2 f / t`` (plain: pre- and post-activation);
        plus, once, the logits ``vocab / t`` and the final norm ``d``. Without dropout and
        with a plain ``f = 4d`` MLP this is Korthikanti et al. 2022
        (https://arxiv.org/abs/2205.05198, eq. 2: ``sbh(34 + 5as/h)`` bytes at 16 bits)
        minus its dropout masks and outputs. ``full``: each layer's input ``d`` plus one
        layer's ``none`` activations while it is recomputed.
        """
        d, f, hd, s, t = self.d_model, self.d_ff, self.head_dim, self.seq_len, tensor
        mlp_hidden = (3 if self.mlp == "gated" else 2) * f
        layer = (
            4 * d
            + (
                (self.heads + 2 * self.kv_heads) * hd
                + self.heads * s
                + self.heads * hd
                + mlp_hidden
            )
            / t
        )
        head = self.vocab / t + d
        if self.remat == "full":
            return self.layers * d + layer + head
        return self.layers * layer + head

    def to_json(self) -> dict[str, Any]:
        return {
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
        }


ModelSpec = MLPSpec | TransformerSpec


def model_spec(
    model: Mapping[str, Any] | ModelSpec, *, default_dtype: str = "bfloat16"
) -> ModelSpec:
    """A checked spec from a plan request's ``model`` object (a spec passes through).

    Args:
      model: ``{"kind": "mlp", "features": [...]}`` or ``{"kind": "transformer",
        "layers", "d_model", "d_ff", "heads", "kv_heads", "vocab", "seq_len"}``, both
        with optional ``dtype`` and ``remat`` (transformer: ``mlp``; MLP: ``loss``).
      default_dtype: dtype when the request gives none (``bfloat16`` for hardware plans).

    Raises:
      PlanError: code ``invalid_model`` naming the field and what is accepted.
    """
    if isinstance(model, MLPSpec | TransformerSpec):
        return model
    if not isinstance(model, Mapping):
        raise PlanError("invalid_model", f"model must be an object with a kind, got {model!r}")
    kind = model.get("kind")
    dtype = _dtype(model.get("dtype"), default_dtype)
    remat = _remat(model.get("remat"))
    if kind == "mlp":
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
        sizes = {
            key: _positive_int(model, key)
            for key in ("layers", "d_model", "d_ff", "heads", "kv_heads", "vocab", "seq_len")
        }
        if sizes["d_model"] % sizes["heads"]:
            raise PlanError(
                "invalid_model",
                f"model.d_model {sizes['d_model']} is not a multiple of heads "
                f"{sizes['heads']}; choose heads dividing d_model",
            )
        if sizes["heads"] % sizes["kv_heads"]:
            raise PlanError(
                "invalid_model",
                f"model.heads {sizes['heads']} is not a multiple of kv_heads "
                f"{sizes['kv_heads']}; choose kv_heads dividing heads",
            )
        mlp = model.get("mlp", "gated")
        if mlp not in ("gated", "plain"):
            raise PlanError("invalid_model", f"model.mlp {mlp!r} is not 'gated' or 'plain'")
        return TransformerSpec(**sizes, mlp=mlp, dtype=dtype, remat=remat)
    raise PlanError("invalid_model", f"model.kind {kind!r} is not 'mlp' or 'transformer'")
