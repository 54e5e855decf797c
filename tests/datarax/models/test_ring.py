"""Ring attention (issue 38, section 2: the ``ring`` context strategy) on the 8 simulated
CPU devices: a transformer whose keys and values go round a context axis gives the loss
and the gradients of the same model on one device, its keys and values are never
gathered (collective-permutes, no all-gather of them), and one device never holds more
than its shard of them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from datarax.models import ActivationLayout, Transformer, synthetic_tokens, transformer_loss_fn
from datarax.models.ring import ring_attention
from datarax.specs.model_specs import model_spec

DENSE = {"kind": "transformer", "layers": 2, "d_model": 32, "d_ff": 64, "heads": 4,
         "kv_heads": 2, "vocab": 61, "seq_len": 32, "dtype": "float32"}  # fmt: skip


@pytest.mark.parametrize("attention", ["flash", "dot"])
@pytest.mark.parametrize("load_balance", [True, False], ids=["balanced", "in-order"])
@pytest.mark.parametrize(
    ("names", "shape"),
    [(("data", "context", "tensor"), (2, 2, 2)), (("fsdp", "context"), (2, 4)),
     (("context",), (8,))],
    ids=["dct", "fsdp-context", "context8"],
)  # fmt: skip
def test_a_ring_equals_the_plain_program(eight_devices, attention, load_balance, names, shape):
    spec = model_spec({**DENSE, "attention": attention})
    params = Transformer(spec, rngs=nnx.Rngs(0)).param_arrays()
    batch = {k: jnp.asarray(v) for k, v in synthetic_tokens(spec, 4, 0, 0).items()}
    reference = jax.jit(jax.value_and_grad(transformer_loss_fn(spec)))(params, batch)
    mesh = Mesh(np.array(eight_devices).reshape(shape), names)
    batch_axes = tuple(a for a in names if a in ("data", "fsdp"))
    tensor = tuple(a for a in names if a == "tensor")
    layout = ActivationLayout(
        mesh, batch_axes, tensor, (), batch_axes, sequence_axes=("context",),
        load_balance=load_balance, strategy="ring",
    )  # fmt: skip
    tokens = NamedSharding(mesh, P(batch_axes or None, "context"))
    sharded = {k: jax.device_put(v, tokens) for k, v in batch.items()}
    step = jax.jit(jax.value_and_grad(transformer_loss_fn(spec, layout)))
    loss, grads = step(params, sharded)
    np.testing.assert_allclose(loss, reference[0], rtol=1e-5)
    for path, grad in reference[1].items():
        np.testing.assert_allclose(grads[path], grad, rtol=2e-4, atol=2e-5, err_msg=path)
    hlo = step.lower(params, sharded).compile().as_text()
    assert "collective-permute" in hlo


def test_the_ring_hands_shards_on_and_never_gathers_them(eight_devices):
    mesh = Mesh(np.array(eight_devices), ("context",))
    layout = ActivationLayout(mesh, sequence_axes=("context",), strategy="ring")
    split = NamedSharding(mesh, P(None, "context"))
    q = jax.device_put(jax.random.normal(jax.random.key(0), (2, 64, 4, 8)), split)
    k = jax.device_put(jax.random.normal(jax.random.key(1), (2, 64, 2, 8)), split)
    v = jax.device_put(jax.random.normal(jax.random.key(2), (2, 64, 2, 8)), split)

    def loss(q, k, v):
        return ring_attention(q, k, v, layout=layout).sum()

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    hlo = grad.lower(q, k, v).compile().as_text()
    assert "all-gather" not in hlo and "collective-permute" in hlo
    # against the materialized attention on one device
    from datarax.models.attention import dot_attention  # noqa: PLC0415

    plain = jax.grad(lambda q, k, v: dot_attention(q, k, v).sum(), argnums=(0, 1, 2))
    for got, want in zip(grad(q, k, v), plain(*(np.asarray(x) for x in (q, k, v))), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)


def test_an_unknown_strategy_is_refused(eight_devices):
    mesh = Mesh(np.array(eight_devices), ("context",))
    with pytest.raises(ValueError, match="not 'all_gather' or 'ring'"):
        ActivationLayout(mesh, sequence_axes=("context",), strategy="ulysses")
