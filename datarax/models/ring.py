"""Ring attention: the ``ring`` context strategy of a plan's ``context_parallel``.

With the sequence split over the context axes, each device keeps its own queries, keys
and values; the keys and values then go round the ring of context devices one shard at a
time (``jax.lax.ppermute``, a collective-permute to the next device), and each device
folds every shard it is handed into an online softmax (Liu et al. 2023, "Ring Attention
with Blockwise Transformers", https://arxiv.org/abs/2310.01889). No device ever holds the
whole sequence's keys and values, which is what the ``all_gather`` strategy
(:meth:`datarax.models.layout.ActivationLayout.gathered`) does; the price is
``context - 1`` hand-offs a layer, which XLA may overlap with the attention of the shard
in hand.

Within a shard the keys are taken a block at a time, as the blockwise kernel does
(:func:`datarax.models.attention.blockwise_attention`), so no pass holds more than
``[S / context, block]`` scores per head. The backward pass is written out
(``jax.custom_vjp``): it saves the queries, the device's own keys and values, the output
and the row log-sum-exp, and sends each shard round the ring again with its gradient
accumulators, which arrive back at the shard's own device after the last hand-off.

Every platform runs this kernel (einsums and a ``lax.scan``, which XLA compiles for TPU,
GPU and CPU alike); the causal mask reads each query's and key's true position, so it
holds for the load-balanced order too (:func:`~datarax.models.layout.balanced_order`).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.lax import PrecisionLike
from jax.sharding import PartitionSpec as P

from datarax.models.attention import _MASKED, _block_size
from datarax.models.attention import _kv_blocks as _blocks
from datarax.models.layout import balanced_order

__all__ = ["ring_attention"]

State = tuple[jax.Array, jax.Array, jax.Array]
_Five = tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]


def _unblock(x: jax.Array) -> jax.Array:
    """The inverse of :func:`_blocks` (``[S / block, B, block, KV, hd]`` -> ``[B, S, KV,
    hd]``)."""
    n, b, block, kv, hd = x.shape
    return x.transpose(1, 0, 2, 3, 4).reshape(b, n * block, kv, hd)


def _scores(
    qg: jax.Array, qpos: jax.Array, kj: jax.Array, kpos: jax.Array, precision: PrecisionLike
) -> tuple[jax.Array, jax.Array]:
    """Scaled, causally masked float32 scores ``[B, KV, G, s, block]`` and the mask."""
    scores = jnp.einsum(
        "bskgd,btkd->bkgst", qg, kj, precision=precision, preferred_element_type=jnp.float32
    ) / math.sqrt(qg.shape[-1])
    visible = qpos[:, None] >= kpos[None, :]
    return jnp.where(visible, scores, _MASKED), visible


def _fold(
    state: State, qg: jax.Array, qpos: jax.Array, k: jax.Array, v: jax.Array,
    kpos: jax.Array, block: int, precision: PrecisionLike,
) -> State:  # fmt: skip
    """The online softmax ``(max, denominator, accumulator)`` with one shard's keys folded
    in, a key block at a time."""

    def body(state: State, xs: tuple[jax.Array, jax.Array, jax.Array]) -> tuple[State, None]:
        m, denom, acc = state
        kj, vj, pj = xs
        scores, _ = _scores(qg, qpos, kj, pj, precision)
        m_new = jnp.maximum(m, scores.max(axis=-1))
        p = jnp.exp(scores - m_new[..., None])
        correction = jnp.exp(m - m_new)
        pv = jnp.einsum("bkgst,btkd->bkgsd", p.astype(vj.dtype), vj, precision=precision,
                        preferred_element_type=jnp.float32)  # fmt: skip
        denom = denom * correction + p.sum(axis=-1)
        return (m_new, denom, acc * correction[..., None] + pv), None

    kpos_blocks = kpos.reshape(-1, block)
    state, _ = jax.lax.scan(body, state, (_blocks(k, block), _blocks(v, block), kpos_blocks))
    return state


def _grads(
    qg: jax.Array, qpos: jax.Array, k: jax.Array, v: jax.Array, kpos: jax.Array,
    saved: tuple[jax.Array, jax.Array, jax.Array], block: int, precision: PrecisionLike,
) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
    """One shard's share of the gradients: ``dq`` of the device's queries and ``dk, dv``
    of the shard's keys and values (float32), a key block at a time (FlashAttention-2's
    backward, Dao 2023, algorithm 2)."""
    d_out, lse, delta = saved
    scale = math.sqrt(qg.shape[-1])

    def body(
        dq: jax.Array, xs: tuple[jax.Array, jax.Array, jax.Array]
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        kj, vj, pj = xs
        scores, visible = _scores(qg, qpos, kj, pj, precision)
        p = jnp.where(visible, jnp.exp(scores - lse[..., None]), 0.0)
        dv = jnp.einsum("bkgst,bskgd->btkd", p.astype(d_out.dtype), d_out, precision=precision,
                        preferred_element_type=jnp.float32)  # fmt: skip
        dp = jnp.einsum("bskgd,btkd->bkgst", d_out, vj, precision=precision,
                        preferred_element_type=jnp.float32)  # fmt: skip
        ds = (p * (dp - delta[..., None]) / scale).astype(qg.dtype)
        dq = dq + jnp.einsum("bkgst,btkd->bskgd", ds, kj, precision=precision,
                             preferred_element_type=jnp.float32)  # fmt: skip
        dk = jnp.einsum("bkgst,bskgd->btkd", ds, qg, precision=precision,
                        preferred_element_type=jnp.float32)  # fmt: skip
        return dq, (dk, dv)

    dq, (dk, dv) = jax.lax.scan(
        body,
        jnp.zeros(qg.shape, jnp.float32),
        (_blocks(k, block), _blocks(v, block), kpos.reshape(-1, block)),
    )
    return dq, _unblock(dk), _unblock(dv)


class _Ring:
    """The ring's geometry on one device: its place, and every shard's key positions."""

    def __init__(self, axis: Any, cp: int, shards: int, local: int) -> None:
        self.axis, self.cp, self.local = axis, cp, local
        self.index = jax.lax.axis_index(axis)
        self.positions = jnp.asarray(balanced_order(local * cp, shards))
        self.perm = [(j, (j + 1) % cp) for j in range(cp)]

    def positions_of(self, hand_offs: jax.Array | int) -> jax.Array:
        """Positions of the shard a device holds after ``hand_offs`` hand-offs: the
        shard of the device ``hand_offs`` places before it."""
        owner = (self.index - hand_offs) % self.cp
        return jax.lax.dynamic_slice(self.positions, (owner * self.local,), (self.local,))

    def pass_on(self, *xs: jax.Array) -> tuple[jax.Array, ...]:
        """Each array handed to the next device of the ring."""
        return tuple(jax.lax.ppermute(x, self.axis, self.perm) for x in xs)


def _ring_forward(
    qg: jax.Array, k: jax.Array, v: jax.Array, axis: Any, cp: int, shards: int,
    block: int, precision: PrecisionLike,
) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    b, s, kv, g, _ = qg.shape
    ring = _Ring(axis, cp, shards, s)
    qpos = ring.positions_of(0)
    state = (
        jnp.full((b, kv, g, s), _MASKED, jnp.float32),
        jnp.zeros((b, kv, g, s), jnp.float32),
        jnp.zeros((b, kv, g, s, v.shape[-1]), jnp.float32),
    )
    state = _fold(state, qg, qpos, k, v, qpos, block, precision)

    def hand_off(
        carry: tuple[jax.Array, jax.Array, State], t: jax.Array
    ) -> tuple[tuple[jax.Array, jax.Array, State], None]:
        k, v, state = carry
        k, v = ring.pass_on(k, v)
        return (k, v, _fold(state, qg, qpos, k, v, ring.positions_of(t), block, precision)), None

    (_, _, (m, denom, acc)), _ = jax.lax.scan(hand_off, (k, v, state), jnp.arange(1, cp))
    out = (acc / denom[..., None]).transpose(0, 3, 1, 2, 4).astype(qg.dtype)  # [B,s,KV,G,vd]
    return out, m + jnp.log(denom)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7))
def _ring(
    qg: jax.Array, k: jax.Array, v: jax.Array, axis: Any, cp: int, shards: int,
    block: int, precision: PrecisionLike,
) -> jax.Array:  # fmt: skip
    return _ring_forward(qg, k, v, axis, cp, shards, block, precision)[0]


def _ring_fwd(
    qg: jax.Array, k: jax.Array, v: jax.Array, axis: Any, cp: int, shards: int,
    block: int, precision: PrecisionLike,
) -> tuple[jax.Array, tuple[jax.Array, ...]]:  # fmt: skip
    out, lse = _ring_forward(qg, k, v, axis, cp, shards, block, precision)
    return out, (qg, k, v, out, lse)


def _ring_bwd(
    axis: Any, cp: int, shards: int, block: int, precision: PrecisionLike,
    residuals: tuple[jax.Array, ...], d_out: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
    qg, k, v, out, lse = residuals
    ring = _Ring(axis, cp, shards, qg.shape[1])
    qpos = ring.positions_of(0)
    d_out = d_out.astype(qg.dtype)
    # D_i = rowsum(dO * O): the softmax Jacobian's diagonal term
    delta = jnp.einsum("bskgd,bskgd->bkgs", d_out.astype(jnp.float32), out.astype(jnp.float32))
    saved = (d_out, lse, delta)
    dq, dk, dv = _grads(qg, qpos, k, v, qpos, saved, block, precision)

    def hand_off(carry: _Five, t: jax.Array) -> tuple[_Five, None]:
        k, v, dk, dv, dq = carry
        # each shard travels with its gradient accumulators
        k, v, dk, dv = ring.pass_on(k, v, dk, dv)
        dq_t, dk_t, dv_t = _grads(qg, qpos, k, v, ring.positions_of(t), saved, block, precision)
        return (k, v, dk + dk_t, dv + dv_t, dq + dq_t), None

    (_, _, dk, dv, dq), _ = jax.lax.scan(hand_off, (k, v, dk, dv, dq), jnp.arange(1, cp))
    dk, dv = ring.pass_on(dk, dv)  # the last hand-off takes them home
    return dq.astype(qg.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


_ring.defvjp(_ring_fwd, _ring_bwd)


def ring_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, *, layout: Any, precision: Any = None
) -> jax.Array:
    """Causal attention with the keys and values passed round the layout's context axes.

    Args:
      q: ``[B, S, H, hd]``, the sequence over the layout's context axes (in its order,
        load-balanced or not), the batch over its batch axes; k: ``[B, S, KV, hd]``,
        ``H % KV == 0``; v: ``[B, S, KV, vd]``; all three split as ``q`` is.
      layout: an :class:`~datarax.models.layout.ActivationLayout` with ``cp > 1``.
      precision: einsum precision.

    Returns:
      ``[B, S, H, vd]`` in ``q.dtype``, split as ``q`` is; equal to the ``all_gather``
      strategy's attention up to float32 rounding of the online softmax.
    """
    cp = layout.cp
    b, s, h, _ = q.shape
    kv = k.shape[2]
    t = getattr(layout, "t", 1)
    heads = layout.tensor if t > 1 and h % t == 0 and kv % t == 0 else None
    spec = P(layout.batch, layout.sequence, heads, None)
    shards = cp if layout.load_balance else 1
    block = _block_size(s // cp)

    def local(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        lb, ls, lh, hd = q.shape
        qg = q.reshape(lb, ls, k.shape[2], lh // k.shape[2], hd)
        out = _ring(qg, k, v, layout.sequence, cp, shards, block, precision)
        return out.reshape(lb, ls, lh, v.shape[-1])

    run = jax.shard_map(
        local, mesh=layout.mesh, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False
    )
    out: jax.Array = run(q, k, v)
    return out
