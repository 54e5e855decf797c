"""The mixture-of-experts feed-forward block of :mod:`datarax.models.transformer`, as
MaxText's ``RoutedMoE`` (``src/maxtext/layers/moe.py``) computes it.

A router ``[d, experts]`` scores each token; the top ``experts_per_token`` experts take it,
their outputs weighted by the softmax of the router's logits over the chosen experts
(renormalised to sum to one). The shared experts (``shared_experts``, DeepSeek and Llama 4)
are one gated MLP every token goes through. Two kernels, as ``moe_kernel`` says:

- ``sparse`` (dropless, MaxText's ``sparse_matmul``): the routed copies of the tokens
  sorted by expert and multiplied by their expert's weights with ``jax.lax.ragged_dot``
  (a grouped matmul; XLA's ragged dot on TPU, its dense fallback elsewhere), then put
  back in token order and summed.
- ``dense`` (capacity, MaxText's ``dense_matmul``): each sequence's tokens are dispatched
  to ``[experts, capacity]`` slots through one-hot masks (``capacity = ceil(S k / E) *
  capacity_factor``; what passes it is dropped), the experts run as batched einsums and
  the combine mask, weighted by the router, brings their outputs back. With an expert
  axis the dispatched ``[experts, batch, capacity, d]`` array is pinned with its experts
  over that axis (:meth:`datarax.models.transformer.ActivationLayout.experts`), so XLA
  moves the tokens to their experts' devices with all-to-all, as MaxText's sharding rules
  make it.

The router's auxiliary load-balancing loss is not added (MaxText's default weight is 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from datarax.estimate.model_specs import TransformerSpec

__all__ = ["MoECompute", "moe_block"]


class MoECompute(Protocol):
    """What the block needs of the model's compute settings (the transformer's)."""

    spec: TransformerSpec
    dtype: Any
    precision: Any

    def dense(self, x: jax.Array, w: jax.Array) -> jax.Array: ...

    def experts(self, x: jax.Array) -> jax.Array: ...

    def c(self, x: jax.Array, tensor_dim: int | None = None) -> jax.Array: ...


def _route(compute: MoECompute, y: jax.Array, router: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(weights [B, S, k] compute dtype, experts [B, S, k] int32)`` of each token."""
    logits = compute.dense(y, router).astype(jnp.float32)
    top, chosen = jax.lax.top_k(logits, compute.spec.experts_per_token)
    weights = jax.nn.softmax(top, axis=-1)  # over the chosen experts: sums to one
    return weights.astype(compute.dtype), chosen.astype(jnp.int32)


def _activation(compute: MoECompute) -> Callable[..., jax.Array]:
    if compute.spec.mlp == "gated":
        return lambda gate, up: jax.nn.silu(gate) * up
    return lambda up: jax.nn.gelu(up)


def _sparse(
    compute: MoECompute, y: jax.Array, weights: jax.Array, chosen: jax.Array, w: list[jax.Array]
) -> jax.Array:
    """Dropless: the routed rows sorted by expert, grouped matmuls, back in token order."""
    b, s, d = y.shape
    k, e = compute.spec.experts_per_token, compute.spec.num_experts
    flat = chosen.reshape(b * s * k)
    order = jnp.argsort(flat, stable=True)
    rows = y.reshape(b * s, d)[order // k]
    sizes = jnp.bincount(flat, length=e).astype(jnp.int32)

    def grouped(x: jax.Array, kernel: jax.Array) -> jax.Array:
        return jax.lax.ragged_dot(x, kernel.astype(compute.dtype), sizes,
                                  precision=compute.precision)  # fmt: skip

    hidden = _activation(compute)(*(grouped(rows, kernel) for kernel in w[:-1]))
    out = grouped(hidden, w[-1])
    back = jnp.zeros_like(out).at[order].set(out).reshape(b, s, k, d)
    return jnp.einsum("bskd,bsk->bsd", back, weights)


def _masks(
    compute: MoECompute, weights: jax.Array, chosen: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """``(dispatch, combine)`` ``[B, S, E, C]`` masks of MaxText's ``generate_masks``:
    each routed copy takes its expert's next slot of this sequence; past the capacity
    it is dropped."""
    spec = compute.spec
    b, s, k = chosen.shape
    e = spec.num_experts
    capacity = max(1, int(math.ceil(s * k / e) * spec.capacity_factor))
    one_hot = jax.nn.one_hot(chosen, e, dtype=jnp.int32)  # [B, S, k, E]
    queue = one_hot.reshape(b, s * k, e)
    slot = ((jnp.cumsum(queue, axis=1) - 1) * queue).sum(-1).reshape(b, s, k)
    kept = jax.nn.one_hot(slot, capacity, dtype=compute.dtype)  # beyond C: all zeros
    expert = one_hot.astype(compute.dtype)
    dispatch = jnp.einsum("bske,bskc->bsec", expert, kept)
    combine = jnp.einsum("bske,bskc,bsk->bsec", expert, kept, weights)
    return dispatch, combine


def _capacity(
    compute: MoECompute, y: jax.Array, weights: jax.Array, chosen: jax.Array, w: list[jax.Array]
) -> jax.Array:
    """Capacity-padded experts: dispatch einsum, batched expert einsums, combine."""
    dispatch, combine = _masks(compute, weights, chosen)
    precision = compute.precision
    x = compute.experts(jnp.einsum("bsd,bsec->ebcd", y, dispatch, precision=precision))

    def expert_matmul(a: jax.Array, kernel: jax.Array) -> jax.Array:
        out = jnp.einsum("ebcd,edf->ebcf", a, kernel.astype(compute.dtype), precision=precision)
        return compute.experts(out)

    hidden = _activation(compute)(*(expert_matmul(x, kernel) for kernel in w[:-1]))
    out = expert_matmul(hidden, w[-1])
    return jnp.einsum("ebcd,bsec->bsd", out, combine, precision=precision)


def moe_block(
    compute: MoECompute, y: jax.Array, p: Mapping[str, jax.Array], prefix: str
) -> jax.Array:
    """The block's output ``[B, S, d]`` for the normed input ``y`` (compute dtype).

    Args:
      compute: the model's compute settings (dtype, precision, layout).
      y: ``[B, S, d]``.
      p: one layer's parameters by spec path (``{prefix}/moe/router``,
        ``{prefix}/moe/experts/wi_0`` ..., ``{prefix}/moe/shared/...``).
      prefix: the layers' path stem (``moe_layers/*``).
    """
    spec = compute.spec
    names = ("wi_0", "wi_1", "wo") if spec.mlp == "gated" else ("wi", "wo")
    kernels = [p[f"{prefix}/moe/experts/{name}"] for name in names]
    weights, chosen = _route(compute, y, p[f"{prefix}/moe/router"])
    kernel = _sparse if spec.moe_kernel == "sparse" else _capacity
    out = kernel(compute, y, weights, chosen, kernels)
    if spec.shared_experts:
        shared = f"{prefix}/moe/shared"
        ups = [compute.dense(y, p[f"{shared}/{name}"]) for name in ("gate", "up")
               if f"{shared}/{name}" in p]  # fmt: skip
        hidden = _activation(compute)(*ups)
        out = out + compute.dense(compute.c(hidden, 2), p[f"{shared}/down"])
    return compute.c(out, 2)
