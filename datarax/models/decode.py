"""KV-cached inference of the transformer of :mod:`datarax.models.transformer`: prefill,
one decode step, greedy generation, and the cache a serving replica holds.

- :func:`prefill` runs the prompt ``[B, S]`` through the model once (the training
  forward's layers: the same projections, norms, MLPs and experts) and returns the last
  position's logits with a cache of ``max_len`` positions whose first ``S`` are filled.
- :func:`decode_step` takes one token per sequence at ``position``, writes its keys and
  values into the cache there and attends over positions ``<= position``.
- :func:`generate`: greedy generation (prefill, then ``steps - 1`` decode steps).

The cache (:func:`init_cache`), one entry per stack of layers (``layers`` for a dense
model; ``dense_layers`` and ``moe_layers`` for a mixture of experts), keys ``{stem}/k``
and ``{stem}/v`` ``[n, B, kv_cache_heads, max_len, head_dim]`` in the compute dtype.
``kv_cache_heads`` is :func:`cache_heads`: the model's ``kv_heads``, or ``tensor`` copies
of them where the tensor axes outnumber the kv heads (vLLM's layout: each device holds
one head, every kv head replicated over ``tensor / kv_heads`` devices), which is what
:func:`datarax.estimate.serving_memory.kv_bytes_per_token` prices. Multi-head latent
attention (MLA) caches the normed compressed latent ``{stem}/latent`` ``[n, B, max_len,
kv_lora_rank]`` and the shared rope key ``{stem}/rope`` ``[n, B, max_len,
qk_rope_head_dim]``, whole on every tensor device; its decode step attends in the latent
space (the up-projection absorbed into the query and the output, as vLLM's and
DeepSeek's MLA decode kernels do), so no ``[max_len, heads, head_dim]`` keys are built.

Sharding (:class:`DecodeLayout`): the batch over the replica (``data``) axes, the cache's
heads over the tensor axes where they divide (replicated otherwise), activations pinned by
the training forward's :class:`~datarax.models.layout.ActivationLayout`. The model has no
positional encoding (as the training forward), so a position only masks the cache.

Example:
  >>> logits, cache = prefill(spec, params, prompt, max_len=32)  # doctest: +SKIP
  >>> logits, cache = decode_step(spec, params, cache, token, 8)  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from datarax.models.layout import ActivationLayout
from datarax.models.moe import moe_block
from datarax.models.transformer import (
    _check_params,
    _Compute,
    _stack,
    _transformer_spec,
)
from datarax.specs.model_specs import TransformerSpec

__all__ = [
    "Cache",
    "DecodeLayout",
    "cache_heads",
    "cache_shapes",
    "decode_step",
    "generate",
    "init_cache",
    "prefill",
]

Cache = dict[str, jax.Array]
"""``{"{stem}/k": [n, B, heads, T, hd], ...}`` (module docstring)."""

_MASKED = -1e30


class DecodeLayout:
    """Where the decode program puts the batch and the heads.

    Args:
      mesh: the mesh.
      batch_axes: replica axes the sequences split over.
      tensor_axes: axes the heads (and MLPs, vocabulary) split over.
      expert_axes: axes the routed experts split over.
    """

    def __init__(
        self,
        mesh: Mesh,
        batch_axes: Sequence[str] = (),
        tensor_axes: Sequence[str] = (),
        expert_axes: Sequence[str] = (),
    ) -> None:
        self.mesh = mesh
        self.activations = ActivationLayout(mesh, batch_axes, tensor_axes, expert_axes)
        sizes = dict(mesh.shape)
        self.t = math.prod(sizes[a] for a in tensor_axes)
        self.batch = self.activations.batch
        self.tensor = self.activations.tensor

    def cache_sharding(self, name: str, shape: Sequence[int]) -> NamedSharding:
        """``[n, B, heads, T, hd]`` with B over the batch axes and the heads over the
        tensor axes where they divide; an MLA entry ``[n, B, T, r]`` whole over tensor."""
        spec: list[Any] = [None] * len(shape)
        spec[1] = self.batch
        if not name.endswith(("/latent", "/rope")) and self.t > 1 and shape[2] % self.t == 0:
            spec[2] = self.tensor
        return NamedSharding(self.mesh, P(*spec))

    def pin(self, cache: Cache) -> Cache:
        return {
            name: jax.lax.with_sharding_constraint(v, self.cache_sharding(name, v.shape))
            for name, v in cache.items()
        }


def cache_heads(spec: TransformerSpec, tensor: int = 1) -> int:
    """KV heads the cache holds (module docstring): ``kv_heads``, or ``tensor`` where
    ``kv_heads < tensor`` and divides it."""
    kv = spec.kv_heads
    return tensor if 1 < tensor and kv < tensor and tensor % kv == 0 else kv


def _stems(spec: TransformerSpec) -> dict[str, int]:
    if not spec.is_moe:
        return {"layers": spec.layers}
    stems = {"dense_layers": spec.dense_layers} if spec.dense_layers else {}
    return {**stems, "moe_layers": spec.moe_layers}


def cache_shapes(
    spec: TransformerSpec | Mapping[str, Any], batch: int, max_len: int, tensor: int = 1
) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of the cache of ``batch`` sequences of ``max_len`` positions."""
    resolved = _transformer_spec(spec)
    out: dict[str, tuple[int, ...]] = {}
    for stem, n in _stems(resolved).items():
        if resolved.attention_type == "mla":
            out[f"{stem}/latent"] = (n, batch, max_len, resolved.kv_lora_rank)
            out[f"{stem}/rope"] = (n, batch, max_len, resolved.qk_rope_head_dim)
        else:
            heads = cache_heads(resolved, tensor)
            for kind in ("k", "v"):
                out[f"{stem}/{kind}"] = (n, batch, heads, max_len, resolved.head_dim)
    return out


def init_cache(
    spec: TransformerSpec | Mapping[str, Any],
    batch: int,
    max_len: int,
    layout: DecodeLayout | None = None,
) -> Cache:
    """An empty (zero) cache in the compute dtype, sharded by ``layout``."""
    resolved = _transformer_spec(spec)
    dtype = _Compute(resolved, None).dtype
    t = layout.t if layout is not None else 1
    cache = {}
    for name, shape in cache_shapes(resolved, batch, max_len, t).items():
        sharding = layout.cache_sharding(name, shape) if layout is not None else None
        cache[name] = jnp.zeros(shape, dtype, device=sharding)
    return cache


# ------------------------------------------------------------------------------ one layer


class _Decoder:
    """One model's layers over a cache: ``x [B, s, d]`` at positions ``start ..
    start + s - 1``."""

    def __init__(self, spec: TransformerSpec, layout: DecodeLayout | None) -> None:
        self.spec = spec
        self.layout = layout
        self.compute = _Compute(spec, layout.activations if layout is not None else None)
        self.t = layout.t if layout is not None else 1

    def _write(self, cache: Cache, name: str, new: jax.Array, layer: Any, start: Any,
               axis: int) -> tuple[Cache, jax.Array]:  # fmt: skip
        """``cache`` with ``new`` (one layer's, no layer axis) written into entry ``name``
        at ``layer`` and position ``start`` along ``axis`` (of the layer's slice), in place;
        and that layer's slice of the entry."""
        entry = cache[name]
        index: list[Any] = [0] * entry.ndim
        index[0], index[axis + 1] = layer, start
        entry = jax.lax.dynamic_update_slice(entry, new.astype(entry.dtype)[None], index)
        if self.layout is not None:
            entry = jax.lax.with_sharding_constraint(
                entry, self.layout.cache_sharding(name, entry.shape)
            )
        return {**cache, name: entry}, jax.lax.dynamic_index_in_dim(entry, layer, 0, False)

    def _mask(self, s: int, total: int, start: Any) -> jax.Array:
        """``[s, T]``: query ``i`` (at ``start + i``) sees cache positions ``<= start + i``."""
        visible: jax.Array = (start + jnp.arange(s))[:, None] >= jnp.arange(total)[None, :]
        return visible

    def _mha(self, y: jax.Array, p: Mapping[str, jax.Array], prefix: str, cache: Cache,
             stem: str, layer: Any, start: Any) -> tuple[jax.Array, Cache]:  # fmt: skip
        spec, comp = self.spec, self.compute
        b, s, _ = y.shape
        h, kv, hd = spec.heads, spec.kv_heads, spec.head_dim
        q, k, v = (
            comp.dense(y, p[f"{prefix}/attn/{name}"]).reshape(b, s, n, hd)
            for name, n in (("q", h), ("k", kv), ("v", kv))
        )
        heads = cache[f"{stem}/k"].shape[2]
        if heads != kv:  # each kv head copied over tensor / kv_heads devices
            k, v = jnp.repeat(k, heads // kv, axis=2), jnp.repeat(v, heads // kv, axis=2)
        cache, keys = self._write(cache, f"{stem}/k", k.transpose(0, 2, 1, 3), layer, start, 2)
        cache, values = self._write(cache, f"{stem}/v", v.transpose(0, 2, 1, 3), layer, start, 2)
        keys, values = keys.astype(comp.dtype), values.astype(comp.dtype)
        qg = comp.c(q, 2).reshape(b, s, heads, h // heads, hd)
        scores = jnp.einsum("bskgd,bktd->bkgst", qg, keys, precision=comp.precision,
                            preferred_element_type=jnp.float32) / math.sqrt(hd)  # fmt: skip
        mask = self._mask(s, keys.shape[2], start)
        probs = jax.nn.softmax(jnp.where(mask, scores, _MASKED), axis=-1).astype(comp.dtype)
        ctx = jnp.einsum("bkgst,bktd->bskgd", probs, values, precision=comp.precision)
        return comp.c(ctx.reshape(b, s, h * hd), 2), cache

    def _mla(self, y: jax.Array, p: Mapping[str, jax.Array], prefix: str, cache: Cache,
             stem: str, layer: Any, start: Any) -> tuple[jax.Array, Cache]:  # fmt: skip
        """Latent-space attention over the compressed cache (module docstring)."""
        spec, comp = self.spec, self.compute
        b, s, _ = y.shape
        h, nope, rope, vd = (
            spec.heads,
            spec.qk_nope_head_dim,
            spec.qk_rope_head_dim,
            spec.v_head_dim,
        )
        rank = spec.kv_lora_rank
        if spec.q_lora_rank > 0:
            low = comp.rms_norm(comp.dense(y, p[f"{prefix}/attn/wq_a"]),
                                p[f"{prefix}/attn/q_norm/scale"])  # fmt: skip
            q = comp.dense(low, p[f"{prefix}/attn/wq_b"])
        else:
            q = comp.dense(y, p[f"{prefix}/attn/q"])
        q = comp.c(q.reshape(b, s, h, nope + rope), 2)
        latent = comp.dense(y, p[f"{prefix}/attn/wkv_a"])
        main = comp.rms_norm(latent[..., :rank], p[f"{prefix}/attn/kv_norm/scale"])
        cache, cached = self._write(cache, f"{stem}/latent", main, layer, start, 1)
        cache, shared = self._write(cache, f"{stem}/rope", latent[..., rank:], layer, start, 1)
        cached, shared = cached.astype(comp.dtype), shared.astype(comp.dtype)
        w = p[f"{prefix}/attn/wkv_b"].astype(comp.dtype).reshape(rank, h, nope + vd)
        prec = comp.precision
        q_latent = jnp.einsum("bshn,rhn->bshr", q[..., :nope], w[..., :nope], precision=prec)
        scores = jnp.einsum("bshr,btr->bhst", q_latent, cached, precision=prec,
                            preferred_element_type=jnp.float32)  # fmt: skip
        scores += jnp.einsum("bshp,btp->bhst", q[..., nope:], shared, precision=prec,
                             preferred_element_type=jnp.float32)  # fmt: skip
        scores /= math.sqrt(nope + rope)
        mask = self._mask(s, cached.shape[1], start)
        probs = jax.nn.softmax(jnp.where(mask, scores, _MASKED), axis=-1).astype(comp.dtype)
        ctx_latent = jnp.einsum("bhst,btr->bshr", probs, cached, precision=prec)
        ctx = jnp.einsum("bshr,rhv->bshv", ctx_latent, w[..., nope:], precision=prec)
        return comp.c(ctx.reshape(b, s, h * vd), 2), cache

    def _mlp(self, y: jax.Array, p: Mapping[str, jax.Array], prefix: str, moe: bool) -> jax.Array:
        comp = self.compute
        if moe:
            return moe_block(comp, y, p, prefix)
        if self.spec.mlp == "gated":
            hidden = jax.nn.silu(comp.dense(y, p[f"{prefix}/mlp/gate"])) * comp.dense(
                y, p[f"{prefix}/mlp/up"]
            )
        else:
            hidden = jax.nn.gelu(comp.dense(y, p[f"{prefix}/mlp/up"]))
        return comp.dense(comp.c(hidden, 2), p[f"{prefix}/mlp/down"])

    def layer_fn(
        self, stem: str, start: Any
    ) -> Callable[..., tuple[tuple[jax.Array, Cache], None]]:
        """``step((x, cache), (layer params, layer index)) -> ((x, cache), None)`` for a
        scan: the whole cache is the carry, so each layer writes its token's keys and
        values into it in place (a cache passed as the scan's ``xs`` and rebuilt as its
        ``ys`` would be a second copy of the cache)."""
        prefix, moe = f"{stem}/*", stem == "moe_layers"
        attend = self._mla if self.spec.attention_type == "mla" else self._mha

        def step(carry: tuple[jax.Array, Cache], xs: tuple[Mapping[str, jax.Array], jax.Array]
                 ) -> tuple[tuple[jax.Array, Cache], None]:  # fmt: skip
            (x, cache), (p, layer) = carry, xs
            comp = self.compute
            y = comp.rms_norm(x, p[f"{prefix}/attn_norm/scale"])
            ctx, cache = attend(y, p, prefix, cache, stem, layer, start)
            x = comp.c(x + comp.dense(ctx, p[f"{prefix}/attn/o"]), 2)
            y = comp.rms_norm(x, p[f"{prefix}/mlp_norm/scale"])
            return (comp.c(x + self._mlp(y, p, prefix, moe), 2), cache), None

        return step

    def layers(
        self, x: jax.Array, params: Mapping[str, jax.Array], cache: Cache, start: Any
    ) -> tuple[jax.Array, Cache]:
        """Every layer in the model's order (:meth:`_Compute._moe_layers`'s order)."""
        spec = self.spec
        if not spec.is_moe:
            xs = (_stack(params, "layers/"), jnp.arange(spec.layers))
            (x, cache), _ = jax.lax.scan(self.layer_fn("layers", start), (x, cache), xs)
            return x, cache
        dense, moe = _stack(params, "dense_layers/"), _stack(params, "moe_layers/")
        first, every, n_moe = spec.first_dense_layers, spec.moe_every, spec.moe_layers
        inner = (every - 1) * n_moe
        dense_step = self.layer_fn("dense_layers", start)
        moe_step = self.layer_fn("moe_layers", start)

        def run(carry: tuple[jax.Array, Cache], lo: int, hi: int) -> tuple[jax.Array, Cache]:
            if hi <= lo:
                return carry
            xs = ({k: v[lo:hi] for k, v in dense.items()}, jnp.arange(lo, hi))
            return jax.lax.scan(dense_step, carry, xs)[0]

        def unit(
            carry: tuple[jax.Array, Cache], xs: tuple[Any, ...]
        ) -> tuple[tuple[jax.Array, Cache], None]:
            mp, m, dp, d = xs
            if every > 1:
                carry, _ = jax.lax.scan(dense_step, carry, (dp, d))
            return moe_step(carry, (mp, m))

        units = {k: v[first : first + inner].reshape(n_moe, every - 1, *v.shape[1:])
                 for k, v in dense.items()}  # fmt: skip
        dense_index = first + jnp.arange(inner).reshape(n_moe, every - 1)
        carry = run((x, cache), 0, first)
        carry, _ = jax.lax.scan(unit, carry, (moe, jnp.arange(n_moe), units, dense_index))
        return run(carry, first + inner, spec.dense_layers)

    def run(
        self, params: Mapping[str, jax.Array], tokens: jax.Array, cache: Cache, start: Any
    ) -> tuple[jax.Array, Cache]:
        """Tokens ``[B, s]`` at ``start ..`` -> (float32 logits of the last ``[B, vocab]``,
        the cache with their keys and values)."""
        comp = self.compute
        x = comp.c(jnp.take(params["embed/embedding"].astype(comp.dtype), tokens, axis=0), 2)
        x, new = self.layers(x, params, cache, start)
        x = comp.rms_norm(x[:, -1:], params["final_norm/scale"])
        logits = comp.logits(x, comp.unembedding(params))[:, 0].astype(jnp.float32)
        if self.layout is not None:
            new = self.layout.pin(new)
        return logits, new


# --------------------------------------------------------------------------- public API


def prefill(
    spec: TransformerSpec | Mapping[str, Any],
    params: Mapping[str, jax.Array],
    tokens: jax.typing.ArrayLike,
    *,
    max_len: int,
    layout: DecodeLayout | None = None,
) -> tuple[jax.Array, Cache]:
    """The prompt through the model: ``(logits [B, vocab] float32 of its last position,
    the cache of ``max_len`` positions, the first ``S`` filled)``.

    Args:
      spec: the model.
      params: as :func:`~datarax.models.transformer.transformer_forward` takes them.
      tokens: ``[B, S]`` int32, ``S <= max_len``.
      max_len: positions the cache holds.
      layout: the sharding (:class:`DecodeLayout`), or none.

    Raises:
      ValueError: a prompt longer than ``max_len``, params that do not match the spec.
    """
    resolved = _transformer_spec(spec)
    _check_params(resolved, params)
    tokens = jnp.asarray(tokens, jnp.int32)
    if tokens.ndim != 2 or tokens.shape[1] > max_len:
        raise ValueError(f"tokens must be [B, S] with S <= max_len {max_len}, got {tokens.shape}")
    cache = init_cache(resolved, tokens.shape[0], max_len, layout)
    return _Decoder(resolved, layout).run(params, tokens, cache, 0)


def decode_step(
    spec: TransformerSpec | Mapping[str, Any],
    params: Mapping[str, jax.Array],
    cache: Cache,
    token: jax.typing.ArrayLike,
    position: jax.typing.ArrayLike,
    *,
    layout: DecodeLayout | None = None,
) -> tuple[jax.Array, Cache]:
    """One token per sequence: ``token [B]`` int32 at ``position`` (a scalar, every
    sequence at the same position) -> ``(logits [B, vocab] float32, the cache with its
    keys and values at ``position``)``. Traceable: ``position`` may be a traced integer."""
    resolved = _transformer_spec(spec)
    tokens = jnp.asarray(token, jnp.int32).reshape(-1, 1)
    position = jnp.asarray(position, jnp.int32)
    return _Decoder(resolved, layout).run(params, tokens, cache, position)


def generate(
    spec: TransformerSpec | Mapping[str, Any],
    params: Mapping[str, jax.Array],
    prompt: jax.typing.ArrayLike,
    steps: int,
    *,
    layout: DecodeLayout | None = None,
) -> jax.Array:
    """Greedy generation: ``steps`` new tokens ``[B, steps]`` int32 after ``prompt [B, S]``
    (the cache holds ``S + steps`` positions)."""
    resolved = _transformer_spec(spec)
    prompt = jnp.asarray(prompt, jnp.int32)
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    s = prompt.shape[1]
    logits, cache = jax.jit(lambda p, t: prefill(resolved, p, t, max_len=s + steps, layout=layout))(
        params, prompt
    )
    step = jax.jit(
        lambda p, c, tok, pos: decode_step(resolved, p, c, tok, pos, layout=layout),
        donate_argnums=(1,),
    )
    out = [jnp.argmax(logits, axis=-1).astype(jnp.int32)]
    for i in range(steps - 1):
        logits, cache = step(params, cache, out[-1], s + i)
        out.append(jnp.argmax(logits, axis=-1).astype(jnp.int32))
    return jnp.stack(out, axis=1)
