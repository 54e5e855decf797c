"""Causal self-attention with grouped key/value heads: materialized or fused.

Both kinds take ``q: [B, S, H, hd]`` and ``k, v: [B, S, KV, hd]`` (``H`` a multiple of
``KV``: query head ``i`` reads key/value head ``i // (H // KV)``, grouped-query attention,
Ainslie et al. 2023, https://arxiv.org/abs/2305.13245) in the compute dtype and return the
context ``[B, S, H, hd]`` in that dtype. Scores are ``q k^T / sqrt(hd)`` in float32.

- :func:`dot_attention`: ``softmax(QK^T)V`` with the ``[B, KV, H / KV, S, S]`` scores in
  memory (MaxText's ``attention: dot_product``).
- :func:`flash_attention`: a fused kernel that never holds ``[S, S]``, chosen by the
  platform of the mesh's devices:

  - TPU: Pallas splash attention (``jax.experimental.pallas.ops.tpu.splash_attention``,
    ``make_splash_mha`` with a ``CausalMask``: masked blocks are skipped), run per device
    under ``jax.shard_map`` because XLA does not partition a Pallas kernel: the batch is
    split over the layout's batch (data, fsdp) axes and the heads over its tensor axes,
    as MaxText's ``AttentionOp.tpu_flash_attention`` does. Sequences that are not a
    multiple of 128 (splash's smallest block) take the CPU path.
  - GPU: cuDNN's fused attention, ``jax.nn.dot_product_attention(..., is_causal=True,
    implementation="cudnn")`` (bfloat16/float16 only; float32 takes the CPU path).
  - CPU (live CPU plans, unit tests): :func:`blockwise_attention`, FlashAttention-2's
    algorithm (Dao 2023, https://arxiv.org/abs/2307.08691) in plain JAX: a ``lax.scan``
    over key blocks with an online softmax forward and a blockwise recomputing backward
    (``jax.custom_vjp``), so neither pass holds more than ``[S, block]`` scores per head
    and the backward saves only ``q, k, v``, the output and the row log-sum-exp. We do
    not use ``jax.nn.dot_product_attention(implementation="xla")`` there: it materializes
    the ``[S, S]`` scores and its autodiff saves them, which is what ``flash`` promises
    not to do.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.lax import PrecisionLike
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from datarax.models.layout import balanced_order

__all__ = ["attention", "blockwise_attention", "dot_attention", "flash_attention"]

_MASKED = -1e30  # finite, so a fully masked block never gives inf - inf = nan
_SPLASH_BLOCKS = (512, 256, 128)  # MaxText's sa_block_* default 512; splash needs 128 | S


def _grouped(q: jax.Array, kv_heads: int) -> jax.Array:
    """``[B, S, H, hd]`` -> ``[B, S, KV, H / KV, hd]``: query heads grouped by KV head."""
    b, s, h, hd = q.shape
    return q.reshape(b, s, kv_heads, h // kv_heads, hd)


def dot_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    precision: Any = None,
    constrain: Any = None,
    shards: int = 1,
) -> jax.Array:
    """Materialized causal attention.

    Args:
      q: ``[B, S, H, hd]`` compute dtype; batch over the batch axes, heads over tensor.
      k: ``[B, S, KV, hd]``, ``H % KV == 0``; v: ``[B, S, KV, vd]`` (``vd`` may differ
        from ``hd``, as MLA's value heads do).
      precision: ``jax.lax.Precision`` of the two einsums (HIGHEST for float32 models).
      constrain: ``constrain(x, tensor_dim)`` pinning the scores' KV-head dimension (an
        :class:`~datarax.models.layout.ActivationLayout` pins them with its ``scores``).
      shards: the queries are in load-balanced order over this many context shards
        (:func:`~datarax.models.layout.balanced_order`); the keys in sequence order.

    Returns:
      ``[B, S, H, vd]`` in ``q.dtype``.
    """
    b, s, h, hd = q.shape
    kv = k.shape[2]
    qg = _grouped(q, kv)
    scores = jnp.einsum(
        "bskgd,btkd->bkgst", qg, k, precision=precision, preferred_element_type=jnp.float32
    ) / math.sqrt(hd)
    pin = getattr(constrain, "scores", None)
    if pin is not None:
        scores = pin(scores)
    elif constrain is not None:
        scores = constrain(scores, 1)
    causal = balanced_order(s, shards)[:, None] >= np.arange(s)[None, :]
    probs = jax.nn.softmax(jnp.where(causal, scores, _MASKED), axis=-1).astype(q.dtype)
    out = jnp.einsum("bkgst,btkd->bskgd", probs, v, precision=precision)
    return out.reshape(b, s, h, v.shape[-1])


def _block_size(s: int, limit: int = 512) -> int:
    """The largest divisor of ``s`` that is at most ``limit``."""
    return next(n for n in range(min(s, limit), 0, -1) if s % n == 0)


def _kv_blocks(x: jax.Array, block: int) -> jax.Array:
    """``[B, S, KV, hd]`` -> ``[S / block, B, block, KV, hd]``, the scan's leading axis."""
    b, s, kv, hd = x.shape
    return x.reshape(b, s // block, block, kv, hd).transpose(1, 0, 2, 3, 4)


def _block_scores(
    qg: jax.Array, kj: jax.Array, j: jax.Array, block: int, precision: PrecisionLike, shards: int
) -> tuple[jax.Array, jax.Array]:
    """Scaled, causally masked float32 scores of all queries (their positions in
    :func:`~datarax.models.layout.balanced_order` over ``shards``) against key block
    ``j``."""
    s, hd = qg.shape[1], qg.shape[-1]
    scores = jnp.einsum(
        "bskgd,btkd->bkgst", qg, kj, precision=precision, preferred_element_type=jnp.float32
    ) / math.sqrt(hd)
    positions = jnp.asarray(balanced_order(s, shards))
    visible = positions[:, None] >= (j * block + jnp.arange(block))[None, :]
    return jnp.where(visible, scores, _MASKED), visible


def _blockwise_forward(
    qg: jax.Array, k: jax.Array, v: jax.Array, block: int, precision: PrecisionLike, shards: int
) -> tuple[jax.Array, jax.Array]:
    b, s, kv, g, _ = qg.shape
    hd = v.shape[-1]
    m0 = jnp.full((b, kv, g, s), _MASKED, jnp.float32)
    l0 = jnp.zeros((b, kv, g, s), jnp.float32)
    acc0 = jnp.zeros((b, kv, g, s, hd), jnp.float32)

    def body(
        carry: tuple[jax.Array, jax.Array, jax.Array], xs: tuple[jax.Array, jax.Array, jax.Array]
    ) -> tuple[tuple[jax.Array, jax.Array, jax.Array], None]:
        m, denom, acc = carry
        kj, vj, j = xs
        scores, _ = _block_scores(qg, kj, j, block, precision, shards)
        m_new = jnp.maximum(m, scores.max(axis=-1))
        p = jnp.exp(scores - m_new[..., None])
        correction = jnp.exp(m - m_new)
        denom = denom * correction + p.sum(axis=-1)
        pv = jnp.einsum(
            "bkgst,btkd->bkgsd", p.astype(vj.dtype), vj, precision=precision,
            preferred_element_type=jnp.float32,
        )  # fmt: skip
        return (m_new, denom, acc * correction[..., None] + pv), None

    n = s // block
    (m, denom, acc), _ = jax.lax.scan(
        body, (m0, l0, acc0), (_kv_blocks(k, block), _kv_blocks(v, block), jnp.arange(n))
    )
    out = (acc / denom[..., None]).transpose(0, 3, 1, 2, 4).astype(qg.dtype)  # [B, S, KV, G, hd]
    return out, m + jnp.log(denom)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _blockwise(
    qg: jax.Array, k: jax.Array, v: jax.Array, block: int, precision: PrecisionLike, shards: int
) -> jax.Array:
    return _blockwise_forward(qg, k, v, block, precision, shards)[0]


def _blockwise_fwd(
    qg: jax.Array, k: jax.Array, v: jax.Array, block: int, precision: PrecisionLike, shards: int
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    out, lse = _blockwise_forward(qg, k, v, block, precision, shards)
    return out, (qg, k, v, out, lse)


def _blockwise_bwd(
    block: int,
    precision: PrecisionLike,
    shards: int,
    residuals: tuple[jax.Array, ...],
    d_out: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    qg, k, v, out, lse = residuals
    hd = qg.shape[-1]
    d_out = d_out.astype(qg.dtype)
    # D_i = rowsum(dO * O): the softmax Jacobian's diagonal term (FlashAttention-2, alg. 2)
    delta = jnp.einsum("bskgd,bskgd->bkgs", d_out.astype(jnp.float32), out.astype(jnp.float32))

    def body(
        dq: jax.Array, xs: tuple[jax.Array, jax.Array, jax.Array]
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        kj, vj, j = xs
        scores, visible = _block_scores(qg, kj, j, block, precision, shards)
        p = jnp.where(visible, jnp.exp(scores - lse[..., None]), 0.0)
        dv = jnp.einsum("bkgst,bskgd->btkd", p.astype(d_out.dtype), d_out, precision=precision,
                        preferred_element_type=jnp.float32)  # fmt: skip
        dp = jnp.einsum("bskgd,btkd->bkgst", d_out, vj, precision=precision,
                        preferred_element_type=jnp.float32)  # fmt: skip
        ds = (p * (dp - delta[..., None]) / math.sqrt(hd)).astype(qg.dtype)
        dq = dq + jnp.einsum("bkgst,btkd->bskgd", ds, kj, precision=precision,
                             preferred_element_type=jnp.float32)  # fmt: skip
        dk = jnp.einsum("bkgst,bskgd->btkd", ds, qg, precision=precision,
                        preferred_element_type=jnp.float32)  # fmt: skip
        return dq, (dk.astype(kj.dtype), dv.astype(vj.dtype))

    n = qg.shape[1] // block
    dq, (dk, dv) = jax.lax.scan(
        body,
        jnp.zeros(qg.shape, jnp.float32),
        (_kv_blocks(k, block), _kv_blocks(v, block), jnp.arange(n)),
    )

    def unblock(x: jax.Array) -> jax.Array:  # [n, B, block, KV, hd] -> [B, S, KV, hd]
        return x.transpose(1, 0, 2, 3, 4).reshape(*k.shape[:3], x.shape[-1])

    return dq.astype(qg.dtype), unblock(dk), unblock(dv)


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)


def blockwise_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    precision: Any = None,
    block: int | None = None,
    shards: int = 1,
) -> jax.Array:
    """Causal attention one key block at a time (the CPU ``flash`` path).

    Args:
      q: ``[B, S, H, hd]``; k: ``[B, S, KV, hd]``; v: ``[B, S, KV, vd]``.
      precision: einsum precision.
      block: keys per step (default: the largest divisor of ``S`` up to 512).
      shards: the queries are in load-balanced order over this many context shards
        (:func:`~datarax.models.layout.balanced_order`); the keys in sequence order.

    Returns:
      ``[B, S, H, vd]`` in ``q.dtype``; equal to :func:`dot_attention` up to float32
      rounding of the online softmax.
    """
    b, s, h, _ = q.shape
    block = block or _block_size(s)
    if s % block:
        raise ValueError(f"block {block} does not divide the sequence length {s}")
    out = _blockwise(_grouped(q, k.shape[2]), k, v, block, precision, shards)
    return out.reshape(b, s, h, v.shape[-1])


def _splash_block(s: int) -> int | None:
    return next((n for n in _SPLASH_BLOCKS if s % n == 0), None)


def _splash(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Splash attention of one device's shard: ``q [b, S, h, hd]``, ``k, v [b, S, kv, hd]``."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash  # noqa: PLC0415

    _, s, h, hd = q.shape
    n = _splash_block(s)
    if n is None:  # flash_attention takes this path only for such lengths
        raise ValueError(f"sequence length {s} is not a multiple of one of {_SPLASH_BLOCKS}")
    sizes = splash.BlockSizes(
        block_q=n, block_kv=n, block_kv_compute=n, block_q_dkv=n, block_kv_dkv=n,
        block_kv_dkv_compute=n, block_q_dq=n, block_kv_dq=n,
    )  # fmt: skip
    mask = splash.MultiHeadMask([splash.CausalMask((s, s)) for _ in range(h)])
    kernel = splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1)
    # the kernel takes one example, heads first, and does not scale the scores
    scaled = (q / math.sqrt(hd)).astype(q.dtype)
    out: jax.Array = jax.vmap(kernel)(
        scaled.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    )
    return out.transpose(0, 2, 1, 3).astype(q.dtype)


def _tpu_flash(q: jax.Array, k: jax.Array, v: jax.Array, layout: Any) -> jax.Array:
    mesh = getattr(layout, "mesh", None)
    if mesh is None or mesh.devices.size == 1:
        return _splash(q, k, v)
    batch, tensor = getattr(layout, "batch", None), getattr(layout, "tensor", None)
    t = getattr(layout, "t", 1)
    heads = tensor if t > 1 and q.shape[2] % t == 0 and k.shape[2] % t == 0 else None
    if getattr(layout, "cp", 1) > 1:
        return _context_splash(q, k, v, layout, heads, t if heads else 1)
    qspec = P(batch, None, heads, None)
    return jax.shard_map(
        _splash, mesh=mesh, in_specs=(qspec, qspec, qspec), out_specs=qspec, check_vma=False
    )(q, k, v)


@functools.cache
def _positioned_mask_class() -> Any:
    from jax.experimental.pallas.ops.tpu.splash_attention import (  # noqa: PLC0415
        splash_attention_mask as masks,
    )

    class PositionedCausalMask(masks._ComputableMask):  # noqa: SLF001
        def __init__(self, shape: tuple[int, int], positions: np.ndarray) -> None:
            super().__init__(shape=shape, mask_function=lambda q, kv: q >= kv)
            self.q_sequence = positions
            self._key = hash((shape, positions.tobytes()))

        def __eq__(self, other: object) -> bool:
            return (
                isinstance(other, PositionedCausalMask)
                and self.shape == other.shape
                and bool(np.array_equal(self.q_sequence, other.q_sequence))
            )

        def __hash__(self) -> int:
            return self._key

    return PositionedCausalMask


def _positioned_causal(shape: tuple[int, int], positions: np.ndarray) -> Any:
    """Splash's lazy causal mask with the queries at ``positions`` (sequence order, or
    a load-balanced one) and the keys in sequence order: one mask every head shares, so
    splash processes it once."""
    return _positioned_mask_class()(shape, positions)


def _context_splash(
    q: jax.Array, k: jax.Array, v: jax.Array, layout: Any, heads: Any, head_shards: int
) -> jax.Array:
    """Splash attention with the queries split over the context axes and the keys and
    values whole (MaxText's ``all_gather`` context strategy): one kernel over the global
    ``[S, S]`` mask with ``q_seq_shards = context``, its mask metadata sharded as the
    queries are (``manual_sharding_spec``), so each device runs its own rows of it."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash  # noqa: PLC0415

    _, s, h, hd = q.shape
    cp = layout.cp
    n = _splash_block(s // cp)
    if n is None:
        raise ValueError(f"the context shard's {s // cp} queries are not a multiple of 128")
    positions = balanced_order(s, cp if layout.load_balance else 1)
    mask = splash.MultiHeadMask([_positioned_causal((s, s), positions)] * h)
    sizes = splash.BlockSizes(
        block_q=n, block_kv=n, block_kv_compute=n, block_q_dkv=n, block_kv_dkv=n,
        block_kv_dkv_compute=n, block_q_dq=n, block_kv_dq=n,
    )  # fmt: skip
    kernel = splash.make_splash_mha(
        mask, block_sizes=sizes, head_shards=head_shards, q_seq_shards=cp
    )
    kernel_spec = kernel.manual_sharding_spec(NamedSharding(layout.mesh, P(heads, layout.sequence)))
    qspec = P(layout.batch, layout.sequence, heads, None)
    kvspec = P(layout.batch, None, heads, None)

    def run(kern: Any, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        scaled = (q / math.sqrt(hd)).astype(q.dtype)
        out: jax.Array = jax.vmap(kern)(
            scaled.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
        )
        return out.transpose(0, 2, 1, 3).astype(q.dtype)

    return jax.shard_map(
        run,
        mesh=layout.mesh,
        in_specs=(kernel_spec, qspec, kvspec, kvspec),
        out_specs=qspec,
        check_vma=False,
    )(kernel, q, k, v)


def platform_of(layout: Any) -> str:
    """``tpu``, ``gpu`` or ``cpu``: the platform of the layout's mesh, else JAX's default."""
    mesh = getattr(layout, "mesh", None)
    if mesh is not None:
        platform: str = mesh.devices.flat[0].platform
        return platform
    return jax.default_backend()


def flash_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, *, precision: Any = None, layout: Any = None
) -> jax.Array:
    """Fused causal attention on the layout's platform (see the module docstring).

    Args:
      q: ``[B, S, H, hd]`` compute dtype, batch over the layout's batch axes, heads over
        its tensor axes; k, v: ``[B, S, KV, hd]``.
      precision: einsum precision of the CPU path.
      layout: an :class:`~datarax.models.transformer.ActivationLayout` (its ``mesh``,
        ``batch`` and ``tensor`` axes); ``None``: JAX's default backend, one device.

    Returns:
      ``[B, S, H, hd]`` in ``q.dtype``.
    """
    platform = platform_of(layout)
    cp = getattr(layout, "cp", 1)
    shards = cp if getattr(layout, "load_balance", False) else 1
    if platform == "tpu" and _splash_block(q.shape[1] // cp) is not None:
        return _tpu_flash(q, k, v, layout)
    # cuDNN's causal mask assumes queries and keys in one order from position 0: a
    # context split takes the blockwise path, which XLA partitions over the queries
    cudnn = q.dtype in (jnp.bfloat16, jnp.float16) and cp == 1
    if platform in ("gpu", "cuda", "rocm") and cudnn:
        # cuDNN takes one head width: MLA's narrower values padded to the keys' width
        vd, pad = v.shape[-1], q.shape[-1] - v.shape[-1]
        if pad > 0:
            v = jnp.pad(v, ((0, 0), (0, 0), (0, 0), (0, pad)))
        out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
        return out[..., :vd]
    return blockwise_attention(q, k, v, precision=precision, shards=shards)


def attention(
    kind: str,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    precision: Any = None,
    layout: Any = None,
) -> jax.Array:
    """``kind`` ``flash`` (:func:`flash_attention`) or ``dot`` (:func:`dot_attention`)."""
    if kind == "flash":
        return flash_attention(q, k, v, precision=precision, layout=layout)
    if kind == "dot":
        shards = layout.cp if getattr(layout, "load_balance", False) else 1
        return dot_attention(q, k, v, precision=precision, constrain=layout, shards=shards)
    raise ValueError(f"attention {kind!r} is not 'flash' or 'dot'")
