"""datarax.spmd.train_step: the SPMD step, the collective (pmap-form) step and
upstream's functional data_parallel_train_step, each checked against one device."""

from __future__ import annotations

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import struct
from flax.training import train_state
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from datarax.distributed import (
    DeviceMeshManager,
    collective_pmap,
    create_data_parallel_sharding,
    data_parallel_train_step,
    place_batch_on_shards,
    reduce_gradients_across_devices,
    spmd_train_step,
)
from tests.conftest import require_devices

N = 8
BATCH, IN, OUT = 32, 4, 2


@pytest.fixture(autouse=True)
def _eight():
    require_devices(N)


def _batch(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH, IN), dtype=np.float32)
    return {"inputs": x, "targets": np.stack([x.sum(1), x[:, 0] - x[:, 1]], 1)}


def _nnx_loss(model, batch):
    return jnp.mean((model(batch["inputs"]) - batch["targets"]) ** 2)


def _model_and_optimizer():
    model = nnx.Linear(IN, OUT, rngs=nnx.Rngs(0))
    return model, nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)


def _params(model):
    return {k: np.asarray(v) for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


# ------------------------------------------------------------------- spmd_train_step


def test_spmd_train_step_on_a_sharded_batch_matches_one_device():
    ref_model, ref_opt = _model_and_optimizer()
    ref_losses = [float(spmd_train_step(ref_model, ref_opt, _nnx_loss, _batch(k))) for k in (0, 1)]

    mesh = DeviceMeshManager.create_data_parallel_mesh()
    sharding = create_data_parallel_sharding(mesh)
    model, optimizer = _model_and_optimizer()
    before = _params(model)
    with jax.set_mesh(mesh):
        batches = [place_batch_on_shards(_batch(k), sharding) for k in (0, 1)]
        losses = [float(spmd_train_step(model, optimizer, _nnx_loss, b)) for b in batches]
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    after = _params(model)
    for path in after:
        assert not np.allclose(after[path], before[path]), path
        np.testing.assert_allclose(after[path], _params(ref_model)[path], rtol=1e-5, atol=1e-6)
    kernel = model.kernel[...]
    assert kernel.sharding.is_equivalent_to(NamedSharding(mesh, P()), 2)
    assert len(kernel.sharding.device_set) == N


# -------------------------------------------------------------------- collective_pmap


def _per_device_step(model, optimizer, batch):
    loss, grads = nnx.value_and_grad(_nnx_loss)(model, batch)
    optimizer.update(model, reduce_gradients_across_devices(grads, "mean"))
    return loss


def test_collective_pmap_updates_the_model_like_spmd():
    ref_model, ref_opt = _model_and_optimizer()
    ref_loss = float(spmd_train_step(ref_model, ref_opt, _nnx_loss, _batch()))
    model, optimizer = _model_and_optimizer()
    step = collective_pmap(_per_device_step, axis_name="batch")
    losses = step(model, optimizer, _batch())
    assert losses.shape == (N,)
    np.testing.assert_allclose(float(jnp.mean(losses)), ref_loss, rtol=1e-5)
    for path, value in _params(model).items():
        np.testing.assert_allclose(value, _params(ref_model)[path], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------- data_parallel_train_step (upstream)


def _linear_loss(variables, batch, rngs=None):
    params = variables["params"]
    scale = variables.get("scale", 1.0)
    preds = batch["inputs"] @ params["w"] + params["b"]
    noise = 0.0 if rngs is None else 0.0 * jax.random.normal(rngs, ())
    return jnp.mean((scale * preds - batch["targets"]) ** 2) + noise


def _train_state(tx):
    params = {"w": jnp.full((IN, OUT), 0.1), "b": jnp.zeros((OUT,))}
    return train_state.TrainState.create(apply_fn=None, params=params, tx=tx)


def _stacked(batch, n=N):
    return jax.tree.map(lambda x: x.reshape(n, -1, *x.shape[1:]), batch)


def test_data_parallel_train_step_updates_params_like_one_device():
    tx = optax.sgd(0.05)
    state = _train_state(tx)
    batch = _batch()
    new_state, metrics = data_parallel_train_step(_linear_loss, tx, _stacked(batch), state)

    # Reference: the full-batch gradient step on one device (equal slices, so the mean of
    # per-device mean gradients is the full-batch mean gradient).
    loss, grads = jax.value_and_grad(lambda p: _linear_loss({"params": p}, batch))(state.params)
    updates, _ = tx.update(grads, state.opt_state, state.params)
    expected = optax.apply_updates(state.params, updates)
    assert int(new_state.step) == 1
    for name in ("w", "b"):
        assert not np.allclose(new_state.params[name], state.params[name]), name
        np.testing.assert_allclose(new_state.params[name], expected[name], rtol=1e-5, atol=1e-6)
    assert metrics["loss"].shape == (N,)
    per_device = [
        _linear_loss({"params": state.params}, jax.tree.map(lambda x, i=i: x[i], _stacked(batch)))
        for i in range(N)
    ]
    np.testing.assert_allclose(np.asarray(metrics["loss"]), per_device, rtol=1e-5)
    np.testing.assert_allclose(float(jnp.mean(metrics["loss"])), float(loss), rtol=1e-5)
    assert "learning_rate" not in metrics  # plain optax.sgd exposes none

    # Several steps keep going down, with adam state carried along.
    tx = optax.adam(0.05)
    state = _train_state(tx)
    losses = []
    for _ in range(5):
        state, metrics = data_parallel_train_step(_linear_loss, tx, _stacked(batch), state)
        losses.append(float(jnp.mean(metrics["loss"])))
    assert losses[-1] < losses[0] and int(state.step) == 5


@struct.dataclass
class _StateWithModelState:
    params: dict
    opt_state: optax.OptState
    step: int
    model_state: dict


def test_data_parallel_train_step_model_state_rngs_and_learning_rate():
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=0.02)
    params = {"w": jnp.full((IN, OUT), 0.1), "b": jnp.zeros((OUT,))}
    state = _StateWithModelState(params, tx.init(params), 0, {"scale": jnp.asarray(2.0)})
    new_state, metrics = data_parallel_train_step(
        _linear_loss, tx, _stacked(_batch(), n=4), state, rngs=jax.random.key(0)
    )
    assert metrics["loss"].shape == (4,)
    np.testing.assert_allclose(np.asarray(metrics["learning_rate"]), [0.02] * 4, rtol=1e-6)
    assert int(new_state.step) == 1 and float(new_state.model_state["scale"]) == 2.0


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"state": object()}, TypeError, "has no \\['params', 'opt_state', 'step', 'replace'\\]"),
        ({"optimizer": "adam"}, TypeError, "optax.GradientTransformation, got str"),
        ({"batch": {"x": np.zeros((16, 2, 2))}}, ValueError, "^Not enough devices.*16.*8"),
        ({"batch": {"x": np.zeros((2, 2)), "y": np.zeros((4, 2))}}, ValueError, "sizes \\[2, 4\\]"),
        ({"batch": {"x": np.zeros((2, 2)), "tag": "a"}}, ValueError, "leaves of type \\['str'\\]"),
    ],
    ids=["bad-state", "bad-optimizer", "too-many-devices", "mixed-sizes", "non-array"],
)
def test_data_parallel_train_step_errors(kwargs, error, match):
    tx = optax.sgd(0.1)
    args = {"loss_fn": _linear_loss, "optimizer": tx, "batch": _stacked(_batch())}
    args["state"] = _train_state(tx)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        data_parallel_train_step(**args)
