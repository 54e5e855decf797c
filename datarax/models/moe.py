"""The mixture-of-experts feed-forward block of :mod:`datarax.models.transformer`, as
MaxText's ``RoutedMoE`` (``src/maxtext/layers/moe.py``) computes it.

A router ``[d, experts]`` scores each token; the top ``experts_per_token`` experts take it,
their outputs weighted by the softmax of the router's logits over the chosen experts
(renormalised to sum to one). The shared experts (``shared_experts``, DeepSeek and Llama 4)
are one gated MLP every token goes through. Two kernels, as ``moe_kernel`` says:

- ``sparse`` (dropless, MaxText's ``sparse_matmul``): the routed copies of the tokens
  sorted by expert and multiplied by their expert's weights with ``jax.lax.ragged_dot``
  (a grouped matmul; XLA's ragged dot on TPU, its dense fallback elsewhere; looped
  where a pipeline's stages batch it: :func:`_grouped_matmul`), then put back in token
  order and summed.
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

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import jax
import jax.numpy as jnp
from jax.custom_batching import sequential_vmap
from jax.sharding import PartitionSpec as P

from datarax.specs.model_specs import TransformerSpec

__all__ = ["MoECompute", "moe_block"]


class MoECompute(Protocol):
    """What the block needs of the model's compute settings (the transformer's)."""

    spec: TransformerSpec
    dtype: Any
    precision: Any

    def dense(self, x: jax.Array, w: jax.Array) -> jax.Array: ...

    def experts(self, x: jax.Array) -> jax.Array: ...

    def c(self, x: jax.Array, tensor_dim: int | None = None) -> jax.Array: ...


@functools.cache
def _grouped_matmul(precision: Any) -> Callable[[jax.Array, jax.Array, jax.Array], jax.Array]:
    """``jax.lax.ragged_dot(x [m, k], kernel [G, k, n], sizes [G])`` at ``precision``,
    whose batched forms (under ``vmap``: a pipeline's stages) loop over the batch
    (``jax.custom_batching.sequential_vmap``), forward and backward. XLA's TPU compiler
    takes no batched ragged dot ("group_sizes with rank > 1 are not yet supported"), and
    inside the expert-parallel ``shard_map`` a stage's batch is one per device anyway.
    ``sequential_vmap`` itself cannot be differentiated, so the function's VJP is written
    out: the ragged dot's own VJP, looped the same way."""

    def plain(x: jax.Array, kernel: jax.Array, sizes: jax.Array) -> jax.Array:
        return jax.lax.ragged_dot(x, kernel, sizes, precision=precision)

    def plain_vjp(
        x: jax.Array, kernel: jax.Array, sizes: jax.Array, g: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        _, vjp = jax.vjp(lambda x, kernel: plain(x, kernel, sizes), x, kernel)
        grads: tuple[jax.Array, jax.Array] = vjp(g)
        return grads

    forward = sequential_vmap(plain)
    backward = sequential_vmap(plain_vjp)

    @jax.custom_vjp
    def grouped(x: jax.Array, kernel: jax.Array, sizes: jax.Array) -> jax.Array:
        out: jax.Array = forward(x, kernel, sizes)
        return out

    def fwd(
        x: jax.Array, kernel: jax.Array, sizes: jax.Array
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
        return forward(x, kernel, sizes), (x, kernel, sizes)

    def bwd(
        saved: tuple[jax.Array, jax.Array, jax.Array], g: jax.Array
    ) -> tuple[jax.Array, jax.Array, None]:
        x, kernel, sizes = saved
        dx, dkernel = backward(x, kernel, sizes, g)
        return dx, dkernel, None

    grouped.defvjp(fwd, bwd)
    return grouped


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
        return _grouped_matmul(compute.precision)(x, kernel.astype(compute.dtype), sizes)

    hidden = _activation(compute)(*(grouped(rows, kernel) for kernel in w[:-1]))
    out = grouped(hidden, w[-1])
    back = jnp.zeros_like(out).at[order].set(out).reshape(b, s, k, d)
    return jnp.einsum("bskd,bsk->bsd", back, weights)


def _sharded_sparse(
    compute: MoECompute, y: jax.Array, weights: jax.Array, chosen: jax.Array, w: list[jax.Array]
) -> jax.Array | None:
    """The dropless kernel as MaxText's sparse path runs it over an expert axis, under
    ``jax.shard_map``: each device routes its own tokens, sends every routed copy to the
    device holding its expert (``all_to_all`` over the expert axes, into a buffer sized
    for the worst case, every copy to one device), runs its own experts' grouped matmuls
    on what it received, sends the results back the same way and sums them by the router's
    weights; the experts' kernels are all-gathered over their fsdp axes inside, a layer
    at a time. Without an expert axis over 1 every device runs all the experts on its own
    tokens, the kernels gathered the same way. ``None`` without a layout over several
    devices, or where it splits the activations over tensor axes (the SPMD kernel then
    runs: XLA's partitioner, not MaxText's program)."""
    layout = getattr(compute, "layout", None)
    e_shards = getattr(layout, "e", 1)
    mesh = getattr(layout, "mesh", None)
    if layout is None or mesh is None or mesh.devices.size <= 1 or getattr(layout, "t", 1) > 1:
        return None
    spec = compute.spec
    e, k = spec.num_experts, spec.experts_per_token
    if e % e_shards:
        return None
    expert = layout.expert if e_shards > 1 else None
    fsdp = tuple(getattr(layout, "fsdp_axes", ()))
    f = math.prod(mesh.shape[a] for a in fsdp)
    fsdp_entry = None if not fsdp else fsdp[0] if len(fsdp) == 1 else fsdp

    def kernel_spec(kernel: jax.Array) -> P:
        dims: list[Any] = [expert, None, None]
        gather = next((d for d in (1, 2) if f > 1 and kernel.shape[d] % f == 0), None)
        if gather is not None:
            dims[gather] = fsdp_entry
        return P(*dims)

    specs = [kernel_spec(kernel) for kernel in w]

    def exchange(a: jax.Array) -> jax.Array:
        # each device's rows for device j of the expert axes to device j, and back
        return a if expert is None else jax.lax.all_to_all(a, expert, 0, 0, tiled=True)

    batch = P(layout.batch)
    local_e = e // e_shards

    def per_device(
        x: jax.Array, gates: jax.Array, ids: jax.Array, *kernels: jax.Array
    ) -> jax.Array:
        full = []
        for kernel, kspec in zip(kernels, specs, strict=True):
            for dim in (1, 2):
                if kspec[dim] is not None:
                    kernel = jax.lax.all_gather(kernel, fsdp, axis=dim, tiled=True)
            full.append(kernel)
        b, s, d = x.shape
        n = b * s * k
        flat = ids.reshape(n)
        order = jnp.argsort(flat, stable=True)
        rows = x.reshape(b * s, d)[order // k]
        sorted_ids = flat[order]
        dest = sorted_ids // local_e
        starts = jnp.cumsum(jnp.bincount(dest, length=e_shards)) - jnp.bincount(
            dest, length=e_shards
        )
        slot = jnp.arange(n) - starts[dest]
        send = jnp.zeros((e_shards, n, d), x.dtype).at[dest, slot].set(rows)
        send_ids = (
            jnp.full((e_shards, n), local_e, jnp.int32).at[dest, slot].set(sorted_ids % local_e)
        )
        got = exchange(send).reshape(e_shards * n, d)
        got_ids = exchange(send_ids).reshape(e_shards * n)
        here = jnp.argsort(got_ids, stable=True)  # the padding (id local_e) last
        sizes = jnp.bincount(got_ids, length=local_e + 1)[:local_e].astype(jnp.int32)

        def grouped(a: jax.Array, kernel: jax.Array) -> jax.Array:
            return _grouped_matmul(compute.precision)(a, kernel.astype(compute.dtype), sizes)

        local_rows = got[here]
        hidden = _activation(compute)(*(grouped(local_rows, kern) for kern in full[:-1]))
        done = grouped(hidden, full[-1])
        back = jnp.zeros_like(done).at[here].set(done).reshape(e_shards, n, d)
        returned = exchange(back)
        out_sorted = returned[dest, slot]
        out = jnp.zeros_like(out_sorted).at[order].set(out_sorted).reshape(b, s, k, d)
        return jnp.einsum("bskd,bsk->bsd", out, gates)

    run = jax.shard_map(
        per_device,
        mesh=mesh,
        in_specs=(batch, batch, batch, *specs),
        out_specs=batch,
        check_vma=False,
    )
    result: jax.Array = run(y, weights, chosen, *w)
    return result


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
    out = None
    if spec.moe_kernel == "sparse":
        out = _sharded_sparse(compute, y, weights, chosen, kernels)
        if out is None:
            out = _sparse(compute, y, weights, chosen, kernels)
    else:
        out = _capacity(compute, y, weights, chosen, kernels)
    if spec.shared_experts:
        shared = f"{prefix}/moe/shared"
        ups = [compute.dense(y, p[f"{shared}/{name}"]) for name in ("gate", "up")
               if f"{shared}/{name}" in p]  # fmt: skip
        hidden = _activation(compute)(*ups)
        out = out + compute.dense(compute.c(hidden, 2), p[f"{shared}/down"])
    return compute.c(out, 2)
