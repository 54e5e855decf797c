"""The built-in MLP (datarax.models.mlp): shapes, parameter names, losses and optimizers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from datarax.models.mlp import MLP, OPTIMIZERS, cross_entropy_loss, make_optimizer, mse_loss


def test_mlp_maps_in_to_out_with_named_float32_parameters():
    model = MLP([4, 8, 3], rngs=nnx.Rngs(0))
    out = model(jnp.ones((5, 4)))
    assert out.shape == (5, 3) and out.dtype == jnp.float32
    params = nnx.state(model, nnx.Param).flat_state()
    paths = {"/".join(str(p) for p in path) for path, _ in params}
    assert paths == {"layers/0/kernel", "layers/0/bias", "layers/1/kernel", "layers/1/bias"}


@pytest.mark.parametrize("features", [[4], [4, 0]], ids=["one-size", "zero"])
def test_mlp_refuses_fewer_than_two_positive_sizes(features):
    with pytest.raises(ValueError, match="at least 2 positive sizes"):
        MLP(features, rngs=nnx.Rngs(0))


def test_losses_match_their_formulas():
    model = MLP([3, 2], rngs=nnx.Rngs(1))
    inputs = jnp.arange(6.0).reshape(2, 3)
    preds = model(inputs)
    targets = jnp.zeros((2, 2))
    mse = mse_loss(model, {"inputs": inputs, "targets": targets})
    np.testing.assert_allclose(mse, jnp.mean(preds**2), rtol=1e-6)
    labels = jnp.array([0, 1])
    ce = cross_entropy_loss(model, {"inputs": inputs, "targets": labels})
    log_probs = jax.nn.log_softmax(preds)
    np.testing.assert_allclose(ce, -jnp.mean(log_probs[jnp.arange(2), labels]), rtol=1e-6)


def test_optimizers_by_name():
    params = {"w": jnp.ones(3)}
    for name in OPTIMIZERS:
        tx = make_optimizer(name, 0.1)
        updates, _ = tx.update({"w": jnp.ones(3)}, tx.init(params), params)
        assert float(updates["w"][0]) < 0, name  # a descent step
    with pytest.raises(ValueError, match="lion"):
        make_optimizer("lion", 0.1)
