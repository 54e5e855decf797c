"""The activation layout of datarax.models (issue 38, section 3: context parallelism in
attention) on the 8 simulated CPU devices: the load-balanced order, and a transformer
whose sequence is split over a context axis gives the loss and the gradients of the same
model on one device, with its keys and values gathered over that axis.
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
from datarax.models.layout import balanced_order
from datarax.models.transformer import transformer_forward
from datarax.specs.model_specs import model_spec

DENSE = {"kind": "transformer", "layers": 2, "d_model": 32, "d_ff": 64, "heads": 4,
         "kv_heads": 2, "vocab": 61, "seq_len": 32, "dtype": "float32"}  # fmt: skip


def test_balanced_order_gives_each_shard_a_chunk_from_each_end():
    # 2 shards, 4 chunks of 2: shard 0 holds chunks 0 and 3, shard 1 chunks 1 and 2
    np.testing.assert_array_equal(balanced_order(8, 2), [0, 1, 6, 7, 2, 3, 4, 5])
    np.testing.assert_array_equal(balanced_order(6, 1), np.arange(6))
    order = balanced_order(64, 4)
    assert sorted(order.tolist()) == list(range(64))
    # every shard's queries see as many keys under a causal mask
    work = [int((order[i * 16 : (i + 1) * 16] + 1).sum()) for i in range(4)]
    assert len(set(work)) == 1, work
    with pytest.raises(ValueError, match="2 x 3 chunks"):
        balanced_order(9, 3)


@pytest.mark.parametrize("attention", ["flash", "dot"])
@pytest.mark.parametrize("load_balance", [True, False], ids=["balanced", "in-order"])
@pytest.mark.parametrize(
    "names", [("data", "context", "tensor"), ("fsdp", "context")], ids=["dct", "fsdp-context"]
)
def test_a_context_split_equals_the_plain_program(eight_devices, attention, load_balance, names):
    spec = model_spec({**DENSE, "attention": attention})
    params = Transformer(spec, rngs=nnx.Rngs(0)).param_arrays()
    batch = {k: jnp.asarray(v) for k, v in synthetic_tokens(spec, 4, 0, 0).items()}
    reference = jax.jit(jax.value_and_grad(transformer_loss_fn(spec)))(params, batch)
    shape = (2, 2, 2) if len(names) == 3 else (2, 4)
    mesh = Mesh(np.array(eight_devices).reshape(shape), names)
    batch_axes = tuple(a for a in names if a in ("data", "fsdp"))
    tensor = tuple(a for a in names if a == "tensor")
    fsdp = tuple(a for a in names if a in ("fsdp", "context"))
    layout = ActivationLayout(
        mesh, batch_axes, tensor, (), fsdp, sequence_axes=("context",), load_balance=load_balance
    )
    assert layout.cp == mesh.shape["context"] and layout.load_balance == load_balance
    tokens = NamedSharding(mesh, P(batch_axes, "context"))
    sharded = {k: jax.device_put(v, tokens) for k, v in batch.items()}
    step = jax.jit(jax.value_and_grad(transformer_loss_fn(spec, layout)))
    loss, grads = step(params, sharded)
    np.testing.assert_allclose(loss, reference[0], rtol=1e-5)
    for path, grad in reference[1].items():
        np.testing.assert_allclose(grads[path], grad, rtol=2e-4, atol=2e-5, err_msg=path)
    # the keys and values are gathered over the context axis
    hlo = step.lower(params, sharded).compile().as_text()
    assert "all-gather" in hlo
    # the logits come back in sequence order
    logits = jax.jit(lambda p, t: transformer_forward(spec, p, t, constrain=layout))(
        params, sharded["inputs"]
    )
    plain = transformer_forward(spec, params, batch["inputs"])
    np.testing.assert_allclose(logits, plain, rtol=2e-4, atol=2e-5)


def test_the_layout_pins_the_sequence_of_token_wise_activations_only(eight_devices):
    mesh = Mesh(np.array(eight_devices).reshape(2, 4), ("data", "context"))
    layout = ActivationLayout(mesh, ("data",), (), (), (), sequence_axes=("context",))
    x = jnp.zeros((4, 16, 8))

    @jax.jit
    def pinned(x):
        return layout(x), layout.gathered(x), layout(x[:, 0])

    def dims(array, n):
        spec = tuple(array.sharding.spec)
        return (*spec, *([None] * (n - len(spec))))[:n]

    a, whole, flat = pinned(x)
    assert dims(a, 3) == ("data", "context", None)
    assert dims(whole, 3) == ("data", None, None)
    assert dims(flat, 2) == ("data", None)
    with pytest.raises(ValueError, match="not axes of the mesh"):
        ActivationLayout(mesh, ("data",), sequence_axes=("sequence",))
