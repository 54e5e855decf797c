"""The decoder-only transformer of :class:`~datarax.specs.model_specs.TransformerSpec`.

One model, two faces: :func:`transformer_loss_fn` is the pure function over a flat
``{spec path: array}`` dict that compile checks lower from shapes
(:mod:`datarax.spmd.compile_step`), and :class:`Transformer` is the NNX module a
user trains with ``nnx.Optimizer`` and :func:`transformer_loss`, over the same arrays.

What the spec's fields do here:

- Mixed precision (MaxText's ``weight_dtype`` / ``dtype``): parameters (and so gradients
  and the optimizer's moments, which ``optax`` creates in the parameters' dtype) are in
  ``param_dtype``; each matmul casts its weight to ``dtype``; activations and the residual
  stream are in ``dtype``; RMS-norm statistics and the cross-entropy are float32. With
  ``dtype: float32`` every matmul runs at ``Precision.HIGHEST`` (true float32, not the
  bfloat16 passes TPUs use by default), which is what the cost model prices at the
  hardware's float32 peak.
- ``remat``: ``jax.checkpoint`` of each layer with a policy over MaxText's
  ``checkpoint_name``\\ s (:func:`remat_policy`).
- ``attention``: ``flash`` or ``dot`` (:mod:`datarax.models.attention`).
- ``vocab_tiling``: the loss over that many token chunks, one chunk's logits live
  (:func:`tiled_cross_entropy`).
- Layers: one ``lax.scan`` over parameters stacked ``[layers, ...]``, so an 80-layer model
  traces and compiles one layer.

The layer follows MaxText's ``LlamaDecoderLayer`` (``MaxText/layers/llama2.py``): named
input, pre-norm attention, residual add, pre-norm MLP, residual add; no positional
encoding (rotary embeddings change neither shapes nor memory) and no dropout.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from datarax.models.attention import attention
from datarax.models.layout import ActivationLayout
from datarax.models.moe import moe_block
from datarax.models.pipeline import WEIGHTS, StagePlan, pipelined_layers
from datarax.models.ring import ring_attention
from datarax.specs.model_specs import TransformerSpec, model_spec

__all__ = [
    "ActivationLayout",
    "Constrain",
    "Transformer",
    "remat_policy",
    "synthetic_tokens",
    "tiled_cross_entropy",
    "transformer_forward",
    "transformer_loss",
    "transformer_loss_fn",
]

JNP_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}

Params = dict[str, jax.Array]
"""Parameters by spec path (a layer's, or stacked ``[layers, ...]``)."""

Constrain = Callable[..., jax.Array]
"""``constrain(x, tensor_dim=None) -> x`` pinning an activation's layout (or not)."""


def _transformer_spec(spec: TransformerSpec | Mapping[str, Any]) -> TransformerSpec:
    """``spec`` resolved (:func:`~datarax.specs.model_specs.model_spec`); it must be
    a transformer."""
    resolved = model_spec(spec)
    if not isinstance(resolved, TransformerSpec):
        raise ValueError(f"the model is a {resolved.kind}; these functions take a transformer")
    return resolved


_NORM_EPS = 1e-6


def _no_constraint(x: jax.Array, tensor_dim: int | None = None) -> jax.Array:  # noqa: ARG001
    return x


# --------------------------------------------------------------------------------- remat


def remat_policy(spec: TransformerSpec) -> tuple[bool, Any]:
    """Whether to ``jax.checkpoint`` each layer, and with which policy.

    Mirrors MaxText's ``Decoder.get_remat_policy`` (``MaxText/layers/decoders.py``) over
    :meth:`TransformerSpec.remat_places`: ``none`` -> no checkpoint (the autodiff keeps
    every residual); ``full`` -> ``nothing_saveable`` (only the layer input, the scan
    carry, survives); any other policy -> ``save_and_offload_only_these_names`` with the
    ``device`` names saved and the ``offload`` names moved to ``pinned_host`` (the
    ``*_offloaded`` policies and ``custom``), or ``save_only_these_names`` when nothing is
    offloaded. MaxText's ``minimal`` is ``checkpoint_dots_with_no_batch_dims``; in this
    layer those dots are exactly the projections its names mark, so the named policy
    saves the same tensors.

    Returns:
      ``(checkpoint, policy)``; ``policy`` is ``None`` when ``checkpoint`` is false.
    """
    places = spec.remat_places()
    if places is None:
        return False, None
    policies = jax.checkpoint_policies
    if spec.remat == "full":
        return True, policies.nothing_saveable
    device = sorted(name for name, where in places.items() if where == "device")
    offload = sorted(name for name, where in places.items() if where == "offload")
    if not offload:
        return True, policies.save_only_these_names(*device)
    return True, policies.save_and_offload_only_these_names(
        names_which_can_be_saved=device,
        names_which_can_be_offloaded=offload,
        offload_src="device",
        offload_dst="pinned_host",
    )


# ------------------------------------------------------------------------------- forward


class _Compute:
    """The dtype, matmul precision and layout every op of one model shares."""

    def __init__(self, spec: TransformerSpec, constrain: Constrain | None) -> None:
        self.spec = spec
        self.dtype = JNP_DTYPES[spec.dtype]
        self.precision = (
            jax.lax.Precision.HIGHEST if spec.dtype == "float32" else jax.lax.Precision.DEFAULT
        )
        self.layout = constrain
        self.c = constrain or _no_constraint
        self.t = getattr(constrain, "t", 1)
        self.cp = getattr(constrain, "cp", 1)

    def experts(self, x: jax.Array) -> jax.Array:
        """``x [experts, ...]`` pinned as the layout pins dispatched tokens (identity
        without a layout that knows expert axes)."""
        pin = getattr(self.layout, "experts", None)
        return x if pin is None else pin(x)

    def balance(self, x: jax.Array) -> jax.Array:
        """``[B, S, ...]`` in the layout's sequence order (load-balanced context splits)."""
        order = getattr(self.layout, "balance", None)
        return x if order is None else order(x)

    def unbalance(self, x: jax.Array) -> jax.Array:
        """The inverse of :meth:`balance`."""
        order = getattr(self.layout, "unbalance", None)
        return x if order is None else order(x)

    def dense(self, x: jax.Array, w: jax.Array) -> jax.Array:
        """``x @ w`` in the compute dtype (the weight cast from ``param_dtype``)."""
        return jnp.matmul(x, w.astype(self.dtype), precision=self.precision)

    def rms_norm(self, x: jax.Array, scale: jax.Array) -> jax.Array:
        """RMS norm with float32 statistics; output in the compute dtype."""
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + _NORM_EPS)
        return y.astype(self.dtype) * scale.astype(self.dtype)

    def layer(
        self, x: jax.Array, p: Mapping[str, jax.Array], prefix: str = "layers/*", moe: bool = False
    ) -> tuple[jax.Array, None]:
        """One decoder layer: ``x [B, S, d]`` -> ``[B, S, d]`` (compute dtype); its
        parameters are ``p``'s under ``prefix`` (``layers/*``, or a mixture-of-experts
        model's ``dense_layers/*`` and ``moe_layers/*``), its feed-forward block the
        experts' (:func:`datarax.models.moe.moe_block`) when ``moe``.

        Names (MaxText's, ``checkpoint_name``): ``decoder_layer_input`` on the input
        (``llama2.py``); ``query_proj``, ``key_proj``, ``value_proj`` on the projections
        ``[B, S, heads, hd]`` and ``context`` on the attention output, ``out_proj`` on the
        output projection ``[B, S, d]`` (``attentions.py``); ``mlpwi_0`` (gate) and
        ``mlpwi_1`` (up) on the gated MLP's input projections before the activation, or
        ``mlpwi`` on a plain MLP's single one, and ``mlpwo`` on its output projection
        (``linears.py``'s ``MlpBlock``: ``"mlp" + dense_name``).
        """
        spec, c = self.spec, self.c
        h, kv = spec.heads, spec.kv_heads
        b, s, _ = x.shape
        x = checkpoint_name(x, "decoder_layer_input")
        y = self.rms_norm(x, p[f"{prefix}/attn_norm/scale"])
        if spec.attention_type == "mla":
            q, k, v = self._mla_qkv(y, p, prefix)
            kv = h
        else:
            q, k, v = (
                self.dense(y, p[f"{prefix}/attn/{name}"]).reshape(b, s, n, spec.head_dim)
                for name, n in (("q", h), ("k", kv), ("v", kv))
            )
        q = checkpoint_name(c(q, 2), "query_proj")
        k = checkpoint_name(c(k, 2), "key_proj")
        v = checkpoint_name(c(v, 2), "value_proj")
        if self.t > 1 and kv % self.t and h % self.t == 0:
            # KV heads the tensor axes cannot split: give each query head its own copy so
            # the heads split evenly (grouping needs whole KV heads per shard)
            k, v = c(jnp.repeat(k, h // kv, axis=2), 2), c(jnp.repeat(v, h // kv, axis=2), 2)
        gather = getattr(self.layout, "gathered", None)
        if self.cp > 1 and getattr(self.layout, "strategy", None) == "ring":
            # context: the keys and values go round the context devices (both kinds)
            ctx = ring_attention(q, k, v, layout=self.layout, precision=self.precision)
        else:
            if self.cp > 1 and gather is not None:  # context: own queries, every key
                k, v = gather(k, 2), gather(v, 2)
            ctx = attention(spec.attention, q, k, v, precision=self.precision, layout=self.layout)
        ctx = checkpoint_name(c(ctx, 2), "context")
        # the d-wide residual stream is split over the tensor axes too (MaxText's
        # activation_embed rule; Megatron's sequence parallelism): the row-parallel
        # projections end in a reduce-scatter, the next norm's input is gathered
        out = checkpoint_name(
            c(self.dense(ctx.reshape(b, s, -1), p[f"{prefix}/attn/o"]), 2), "out_proj"
        )
        x = c(x + out, 2)
        y = self.rms_norm(x, p[f"{prefix}/mlp_norm/scale"])
        if moe:
            return c(x + moe_block(self, y, p, prefix), 2), None
        if spec.mlp == "gated":
            gate = checkpoint_name(c(self.dense(y, p[f"{prefix}/mlp/gate"]), 2), "mlpwi_0")
            up = checkpoint_name(c(self.dense(y, p[f"{prefix}/mlp/up"]), 2), "mlpwi_1")
            hidden = jax.nn.silu(gate) * up
        else:
            up = checkpoint_name(c(self.dense(y, p[f"{prefix}/mlp/up"]), 2), "mlpwi")
            hidden = jax.nn.gelu(up)
        down = checkpoint_name(c(self.dense(c(hidden, 2), p[f"{prefix}/mlp/down"]), 2), "mlpwo")
        return c(x + down, 2), None

    def _mla_qkv(
        self, y: jax.Array, p: Mapping[str, jax.Array], prefix: str
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Multi-head latent attention's queries, keys and values (DeepSeek-V2/V3, MaxText's
        ``attention_mla.py``): queries through the ``q_lora_rank`` bottleneck and its norm
        (or one projection when the rank is 0); keys and values from one ``kv_lora_rank``
        latent, normed, then up-projected per head into the keys' ``qk_nope_head_dim``
        part and the ``v_head_dim`` values; each key's ``qk_rope_head_dim`` part is one
        projection shared by every head. ``q, k [B, S, H, nope + rope]``,
        ``v [B, S, H, v_head_dim]``. (No rotary embedding, as in the rest of the model.)"""
        spec, c = self.spec, self.c
        b, s, _ = y.shape
        h, nope, rope = spec.heads, spec.qk_nope_head_dim, spec.qk_rope_head_dim
        if spec.q_lora_rank > 0:
            low = self.rms_norm(self.dense(y, p[f"{prefix}/attn/wq_a"]),
                                p[f"{prefix}/attn/q_norm/scale"])  # fmt: skip
            q = self.dense(low, p[f"{prefix}/attn/wq_b"])
        else:
            q = self.dense(y, p[f"{prefix}/attn/q"])
        latent = self.dense(y, p[f"{prefix}/attn/wkv_a"])
        main, shared = latent[..., : spec.kv_lora_rank], latent[..., spec.kv_lora_rank :]
        main = self.rms_norm(main, p[f"{prefix}/attn/kv_norm/scale"])
        kv = self.dense(main, p[f"{prefix}/attn/wkv_b"]).reshape(b, s, h, nope + spec.v_head_dim)
        kv = c(kv, 2)
        k_rope = jnp.broadcast_to(shared[:, :, None, :], (b, s, h, rope))
        k = jnp.concatenate([kv[..., :nope], k_rope], axis=-1)
        return q.reshape(b, s, h, nope + rope), k, kv[..., nope:]

    def layer_step(
        self, prefix: str, moe: bool, checkpoint: bool, policy: Any
    ) -> Callable[..., tuple[jax.Array, None]]:
        """``step(x, layer_params) -> (x, None)``: one layer for a ``lax.scan``, under
        ``jax.checkpoint`` with the remat policy when ``checkpoint``."""

        def one(x: jax.Array, p: Mapping[str, jax.Array]) -> tuple[jax.Array, None]:
            return self.layer(x, p, prefix, moe)

        # prevent_cse=False: inside a scan CSE cannot undo the recompute (jax docs)
        return jax.checkpoint(one, policy=policy, prevent_cse=False) if checkpoint else one

    def unembedding(self, params: Mapping[str, jax.Array]) -> jax.Array:
        """``[d, vocab]`` in the compute dtype (the embedding's transpose when tied)."""
        if self.spec.tied_embeddings:
            return params["embed/embedding"].astype(self.dtype).T
        return params["unembed/kernel"].astype(self.dtype)

    def logits(self, x: jax.Array, w: jax.Array) -> jax.Array:
        """``[B, s, d]`` normed hidden states -> ``[B, s, vocab]`` logits, compute dtype
        (vocab over the tensor axes); the loss converts them to float32 as it reads them."""
        return self.c(jnp.matmul(x, w, precision=self.precision), 2)

    def hidden(self, params: Mapping[str, jax.Array], tokens: jax.Array) -> jax.Array:
        """Tokens ``[B, S]`` -> final-norm output ``[B, S, d]`` in the compute dtype."""
        c = self.c
        # cast, then look up (MaxText's Embed): the gathered table and the lookup's
        # gradient are in the compute dtype, not param_dtype
        x = c(jnp.take(params["embed/embedding"].astype(self.dtype), tokens, axis=0), 2)
        checkpoint, policy = remat_policy(self.spec)

        def layer_fn(prefix: str, moe: bool) -> Callable[..., tuple[jax.Array, None]]:
            return self.layer_step(prefix, moe, checkpoint, policy)

        pipeline = getattr(self.layout, "pipeline", None)
        if pipeline is not None:
            # the layers run inside the stages with the batch over the batch axes alone
            inner = _Compute(self.spec, _inner_layout(self.layout))
            keep = _stage_policy(self.spec)

            def inner_fn(prefix: str, moe: bool) -> Callable[..., tuple[jax.Array, None]]:
                return inner.layer_step(prefix, moe, checkpoint, policy)

            if self.spec.is_moe:
                x = self._moe_layers(x, params, layer_fn, (pipeline, keep, inner, inner_fn))
            else:
                # into the stages with the batch whole over the stage axes (a [B] split
                # over data x stage does not reshape into microbatches), out split again
                step, stack = inner_fn("layers/*", False), _stack(params, "layers/")
                x = c(pipelined_layers(inner.c(x, 2), stack, step, pipeline, inner.layout, keep), 2)
        elif not self.spec.is_moe:
            x, _ = jax.lax.scan(layer_fn("layers/*", False), x, _stack(params, "layers/"))
        else:
            x = self._moe_layers(x, params, layer_fn)
        return self.rms_norm(x, params["final_norm/scale"])

    def _moe_layers(
        self,
        x: jax.Array,
        params: Mapping[str, jax.Array],
        layer_fn: Callable[[str, bool], Callable[..., tuple[jax.Array, None]]],
        staged: tuple[StagePlan, Any, _Compute, Callable[..., Any]] | None = None,
    ) -> jax.Array:
        """A mixture-of-experts model's layers in their order: the ``first_dense_layers``,
        then ``moe_layers`` units of ``moe_every - 1`` dense layers and one MoE layer
        (MaxText's ``interleave_moe_layer_step``), then any dense layers left; the units a
        ``lax.scan`` over their slices of the ``dense_layers/*`` and ``moe_layers/*``
        stacks, the dense layers outside them one each.

        ``staged``: the pipeline, its stage policy, the compute inside its stages and
        that compute's ``layer_fn``: the units run as the pipeline's stages
        (:func:`~datarax.models.pipeline.pipelined_layers`), the dense layers outside the
        units before and after them, with the batch split over the stage axes too."""
        spec = self.spec
        dense, moe = _stack(params, "dense_layers/"), _stack(params, "moe_layers/")
        first, every, n_moe = spec.first_dense_layers, spec.moe_every, spec.moe_layers
        dense_step = layer_fn("dense_layers/*", False)

        def run(x: jax.Array, stack: dict[str, jax.Array], lo: int, hi: int) -> jax.Array:
            if hi > lo:
                x, _ = jax.lax.scan(dense_step, x, {k: v[lo:hi] for k, v in stack.items()})
            return x

        x = run(x, dense, 0, first)
        inner = (every - 1) * n_moe
        units = dict(moe)
        if every > 1:
            units.update({k: v[first : first + inner].reshape(n_moe, every - 1, *v.shape[1:])
                          for k, v in dense.items()})  # fmt: skip
        if staged is None:
            x, _ = jax.lax.scan(_moe_unit(layer_fn, every), x, units)
        else:
            plan, keep, within, within_fn = staged
            unit = _moe_unit(within_fn, every)
            x = self.c(pipelined_layers(within.c(x, 2), units, unit, plan, within.layout, keep), 2)
        return run(x, dense, first + inner, spec.dense_layers)


def _moe_unit(
    layer_fn: Callable[[str, bool], Callable[..., tuple[jax.Array, None]]], every: int
) -> Callable[[jax.Array, Mapping[str, jax.Array]], tuple[jax.Array, None]]:
    """One unit of a mixture-of-experts model's interleaved layers: ``every - 1`` dense
    layers (their ``dense_layers/*`` slices stacked ``[every - 1, ...]``), then the MoE
    layer (its ``moe_layers/*`` slices)."""
    dense_step, moe_step = layer_fn("dense_layers/*", False), layer_fn("moe_layers/*", True)

    def unit(x: jax.Array, ps: Mapping[str, jax.Array]) -> tuple[jax.Array, None]:
        if every > 1:
            own = {k: v for k, v in ps.items() if k.startswith("dense_layers/")}
            x, _ = jax.lax.scan(dense_step, x, own)
        return moe_step(x, {k: v for k, v in ps.items() if k.startswith("moe_layers/")})

    return unit


def _stage_policy(spec: TransformerSpec) -> Any:
    """The checkpoint policy of a pipeline stage's pass: what the layers' remat keeps
    (their inputs and the names it saves on the device), never the stage's weight slices."""
    places = spec.remat_places()
    if places is None:  # remat none: everything but the weight slices
        return jax.checkpoint_policies.save_anything_except_these_names(WEIGHTS)
    kept = [name for name, where in places.items() if where == "device"]
    return jax.checkpoint_policies.save_only_these_names("decoder_layer_input", *kept)


def _inner_layout(layout: Any) -> Any:
    """The layout inside a pipeline's stages (:meth:`ActivationLayout.within_stages`)."""
    return layout.within_stages()


def _stack(params: Mapping[str, jax.Array], stem: str) -> dict[str, jax.Array]:
    return {k: v for k, v in params.items() if k.startswith(stem)}


def _check_params(spec: TransformerSpec, params: Mapping[str, Any]) -> None:
    want = {g.path: ((g.repeat, *g.shape) if "*" in g.path else g.shape) for g in spec.params()}
    got = {k: tuple(v.shape) for k, v in params.items()}
    if got != want:
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        wrong = sorted(k for k in set(want) & set(got) if want[k] != got[k])
        raise ValueError(
            f"params do not match the spec: missing {missing}, unexpected {extra}, "
            f"wrong shapes {[(k, got[k], want[k]) for k in wrong]}; build them with "
            "Transformer(spec).param_arrays() or the spec's params() (layers stacked first)"
        )


def transformer_forward(
    spec: TransformerSpec | Mapping[str, Any],
    params: Mapping[str, jax.Array],
    tokens: jax.typing.ArrayLike,
    *,
    constrain: Constrain | None = None,
) -> jax.Array:
    """Logits of every position.

    Args:
      spec: the model.
      params: ``{spec path: array}`` in ``param_dtype``; ``layers/*`` groups stacked
        ``[layers, ...]`` (e.g. ``layers/*/attn/q: [layers, d_model, heads * head_dim]``).
      tokens: ``[B, S]`` int32 token ids, batch over the layout's batch axes.
      constrain: an :class:`ActivationLayout` (or any ``constrain(x, tensor_dim)``).

    Returns:
      ``[B, S, vocab]`` float32 logits (vocab over the tensor axes).
    """
    resolved = _transformer_spec(spec)
    _check_params(resolved, params)
    compute = _Compute(resolved, constrain)
    x = compute.hidden(params, compute.balance(jnp.asarray(tokens)))
    logits = compute.logits(x, compute.unembedding(params)).astype(jnp.float32)
    return compute.unbalance(logits)


def _cross_entropy_head(
    logits_fn: Callable[[jax.Array, jax.Array], jax.Array], constrain: Constrain
) -> Callable[[jax.Array, jax.Array, jax.Array], jax.Array]:
    """``head(x [B, s, d], w [d, vocab], targets [B, s]) -> float32 sum of losses``.

    A ``jax.custom_vjp`` (as MaxText's ``cross_entropy_with_logits`` and its vocab
    tiling): the forward pass keeps only the per-token float32 log-sum-exp; the backward
    pass recomputes the logits and writes ``softmax - one_hot`` straight in the compute
    dtype. The softmax statistics are float32 (the logits converted as they are read).
    Autodiff of the plain expression instead keeps float32 logits and several
    ``[tokens, vocab]`` copies alive at once (XLA's memory report for Llama 3.1 8B at
    3 x 8192 tokens per chip: ~20 GiB of logit buffers instead of ~12).
    """

    def forward(
        x: jax.Array, w: jax.Array, targets: jax.Array
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array, jax.Array]]:
        # every [tokens, vocab] op reads the compute-dtype logits and converts inside the
        # fusion; a float32 copy of the logits (or a gather from one) would be 2x their size
        logits = logits_fn(x, w)
        top = jnp.max(logits, axis=-1, keepdims=True).astype(jnp.float32)
        sum_exp = jnp.sum(jnp.exp(logits.astype(jnp.float32) - top), axis=-1)
        lse = top[..., 0] + jnp.log(sum_exp)
        label = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
        return jnp.sum(lse - label.astype(jnp.float32)), (x, w, targets, lse)

    def backward(
        residuals: tuple[jax.Array, jax.Array, jax.Array, jax.Array], g: jax.Array
    ) -> tuple[jax.Array, jax.Array, None]:
        x, w, targets, lse = residuals
        logits = logits_fn(x, w)
        vocab = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
        probs = jnp.exp(logits.astype(jnp.float32) - lse[..., None])
        d_logits = (probs - (vocab == targets[..., None])) * g
        d_logits = constrain(d_logits.astype(x.dtype), 2)
        precision = jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else None
        dx = jnp.einsum("bsv,dv->bsd", d_logits, w, precision=precision)
        dw = jnp.einsum("bsd,bsv->dv", x, d_logits, precision=precision)
        return dx, dw, None

    @jax.custom_vjp
    def head(x: jax.Array, w: jax.Array, targets: jax.Array) -> jax.Array:
        return forward(x, w, targets)[0]

    head.defvjp(forward, backward)
    return head


def tiled_cross_entropy(
    x: jax.Array,
    w: jax.Array,
    targets: jax.Array,
    tiles: int,
    logits_fn: Callable[[jax.Array, jax.Array], jax.Array],
    constrain: Constrain | None = None,
) -> jax.Array:
    """Summed next-token cross-entropy over ``tiles`` token chunks, one chunk's logits live.

    MaxText's ``num_vocab_tiling`` (``MaxText/vocabulary_tiling.py``) reshapes the final
    hidden states to ``[tiles, tokens / tiles, d]`` and scans over the chunks with a
    custom VJP that recomputes each chunk's logits in the backward pass. Here the chunks
    split the sequence (``[B, S, d]`` -> ``[tiles, B, S / tiles, d]``), so every chunk
    keeps the batch's sharding with no re-layout; each chunk's loss is the custom-VJP
    head (:func:`_cross_entropy_head`), so the scan saves only the chunk's per-token
    log-sum-exp, and the unembedding's gradient accumulates across chunks in the scan's
    transpose. ``tiles == 1`` is the head over the whole batch, no scan.

    Args:
      x: ``[B, S, d]`` final-norm output, compute dtype, batch over the batch axes.
      w: ``[d, vocab]`` unembedding, compute dtype.
      targets: ``[B, S]`` int32.
      tiles: chunks; must divide ``S``.
      logits_fn: ``logits_fn(x_chunk, w) -> [B, S / tiles, vocab]`` in the compute dtype.
      constrain: pins the logits' gradient like the logits (vocab over tensor).

    Returns:
      The float32 sum of the per-token losses.

    Raises:
      ValueError: ``tiles`` does not divide ``S``.
    """
    b, s, d = x.shape
    if s % tiles:
        raise ValueError(
            f"vocab_tiling {tiles} does not divide seq_len {s}; choose a divisor of {s}"
        )
    head = _cross_entropy_head(logits_fn, constrain or _no_constraint)
    if tiles == 1:
        return head(x, w, targets)

    def chunk_loss(total: jax.Array, chunk: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, None]:
        xc, tc = chunk
        return total + head(xc, w, tc), None

    xs = x.reshape(b, tiles, s // tiles, d).swapaxes(0, 1)
    ts = targets.reshape(b, tiles, s // tiles).swapaxes(0, 1)
    total, _ = jax.lax.scan(chunk_loss, jnp.zeros((), jnp.float32), (xs, ts))
    return total


def transformer_loss_fn(
    spec: TransformerSpec | Mapping[str, Any], constrain: Constrain | None = None
) -> Callable[[Mapping[str, jax.Array], Mapping[str, jax.Array]], jax.Array]:
    """``loss(params, batch)``: mean next-token cross-entropy, float32.

    Args:
      spec: the model.
      constrain: an :class:`ActivationLayout` (or any ``constrain(x, tensor_dim)``).

    Returns:
      ``loss(params, batch)`` with ``params`` as :func:`transformer_forward` takes them
      and ``batch = {"inputs": [B, S] int32, "targets": [B, S] int32}``.
    """
    resolved = _transformer_spec(spec)
    compute = _Compute(resolved, constrain)

    def loss(params: Mapping[str, jax.Array], batch: Mapping[str, jax.Array]) -> jax.Array:
        _check_params(resolved, params)
        # a load-balanced context split holds the sequence in its own order: the mean
        # over tokens is the same in any order
        x = compute.hidden(params, compute.balance(batch["inputs"]))
        w = compute.unembedding(params)
        targets = compute.balance(batch["targets"])
        total = tiled_cross_entropy(x, w, targets, resolved.vocab_tiling, compute.logits, compute.c)
        return total / targets.size

    return loss


# ----------------------------------------------------------------------------- NNX model


def _init(key: jax.Array, path: str, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    """Ones for norm scales; normal ``1 / sqrt(fan_in)`` for kernels (LeCun), and for the
    embedding ``1 / sqrt(d_model)`` (flax's ``nnx.Embed`` default)."""
    if path.endswith("/scale"):
        return jnp.ones(shape, dtype)
    fan_in = shape[-1] if path.startswith("embed/") else shape[-2]
    return (jax.random.normal(key, shape, jnp.float32) / math.sqrt(fan_in)).astype(dtype)


class Transformer(nnx.Module):
    """The spec's transformer as an NNX module, for training with ``nnx.Optimizer``.

    Parameters are ``nnx.Param``\\ s in ``param_dtype`` nested like the spec's paths:
    ``embed["embedding"]`` ``[vocab, d]``, ``layers["attn"]["q"]`` ``[layers, d, heads *
    head_dim]`` (every ``layers/*`` group stacked over the layers), ``final_norm["scale"]``,
    ``unembed["kernel"]`` ``[d, vocab]`` (absent with tied embeddings).

    Args:
      model: a :class:`TransformerSpec` or a plan request's model object
        (``{"kind": "transformer", ...}`` or ``{"name": "llama3.1-8b", ...}``).
      rngs: initialization keys (``params`` stream).
      constrain: an optional :class:`ActivationLayout` for sharded training.

    Raises:
      ValueError: ``model`` is not a transformer (or not a valid model object).

    Example:
      >>> model = Transformer({"kind": "transformer", "layers": 2, "d_model": 64,
      ...     "d_ff": 128, "heads": 4, "kv_heads": 2, "vocab": 100, "seq_len": 16},
      ...     rngs=nnx.Rngs(0))  # doctest: +SKIP
      >>> opt = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)  # doctest: +SKIP
    """

    def __init__(
        self,
        model: TransformerSpec | Mapping[str, Any],
        *,
        rngs: nnx.Rngs,
        constrain: Constrain | None = None,
    ) -> None:
        try:
            spec = model_spec(model)
        except Exception as error:  # PlanError: an invalid model object
            raise ValueError(str(error)) from None
        if not isinstance(spec, TransformerSpec):
            raise ValueError(f"Transformer needs a transformer model, got kind {spec.kind!r}")
        self.spec = spec
        self.constrain = constrain
        dtype = JNP_DTYPES[spec.param_dtype]
        nested: dict[str, Any] = {}
        for group in spec.params():
            shape = (group.repeat, *group.shape) if "*" in group.path else group.shape
            value = nnx.Param(_init(rngs.params(), group.path, shape, dtype))
            *parents, leaf = [part for part in group.path.split("/") if part != "*"]
            node = nested
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        for name, tree in nested.items():
            setattr(self, name, _to_nnx(tree))

    def param_arrays(self) -> dict[str, jax.Array]:
        """``{spec path: array}`` (``layers/*/attn/q`` stacked), as :func:`transformer_forward`
        and compile checks take them."""
        out = {}
        for group in self.spec.params():
            node: Any = self
            for part in (p for p in group.path.split("/") if p != "*"):
                node = getattr(node, part) if node is self else node[part]
            out[group.path] = node[...]
        return out

    def __call__(self, tokens: jax.typing.ArrayLike) -> jax.Array:
        """``tokens: [B, S]`` int32 -> logits ``[B, S, vocab]`` float32."""
        return transformer_forward(self.spec, self.param_arrays(), tokens, constrain=self.constrain)


def _to_nnx(tree: dict[str, Any]) -> nnx.Dict[Any]:
    return nnx.Dict({k: _to_nnx(v) if isinstance(v, dict) else v for k, v in tree.items()})


def transformer_loss(model: Transformer, batch: Mapping[str, jax.typing.ArrayLike]) -> jax.Array:
    """Mean next-token cross-entropy of ``model`` on ``batch``, float32.

    The ``loss_fn(model, batch)`` of :func:`datarax.spmd.train_step.spmd_train_step`.

    Args:
      model: a :class:`Transformer`.
      batch: ``{"inputs": [B, S] int32, "targets": [B, S] int32}`` (:func:`synthetic_tokens`).
    """
    loss = transformer_loss_fn(model.spec, model.constrain)
    return loss(model.param_arrays(), {k: jnp.asarray(v) for k, v in batch.items()})


def synthetic_tokens(
    model: TransformerSpec | Mapping[str, Any], batch_size: int, seed: int, step: int
) -> dict[str, np.ndarray]:
    """A deterministic token batch that depends only on its arguments, never on devices.

    Each row follows a fixed random successor table of the vocabulary from a random start,
    so the next token is a function of the current one and the loss can go down.

    Returns:
      ``inputs: [batch_size, seq_len] int32`` and ``targets: [batch_size, seq_len] int32``,
      ``targets[:, i] == inputs[:, i + 1]`` (the last one the successor of the last input).
    """
    spec = model_spec(model)
    if not isinstance(spec, TransformerSpec):
        raise ValueError(f"synthetic_tokens needs a transformer model, got kind {spec.kind!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    successor = np.random.default_rng([int(seed), 104729]).permutation(spec.vocab)
    rng = np.random.default_rng([int(seed), int(step), int(batch_size)])
    tokens = np.empty((batch_size, spec.seq_len + 1), np.int64)
    tokens[:, 0] = rng.integers(0, spec.vocab, batch_size)
    for i in range(spec.seq_len):
        tokens[:, i + 1] = successor[tokens[:, i]]
    tokens = tokens.astype(np.int32)
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
