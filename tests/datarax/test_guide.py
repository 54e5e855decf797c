"""Every code block of the distributed-training guide, run against our package.

Blocks are copied as written; only the guide's placeholders (``MyNNXModel``,
``compute_loss``, ``load_data_batch``, ``batch``, ``state``, ``gradients``,
``metrics``, ``num_steps``) are filled in. Where the guide's code cannot work in
current JAX (the pmap section), a test proves that, and another runs the working form.
"""

from __future__ import annotations

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tests.conftest import require_devices

BATCH = 32
IN, HIDDEN, OUT = 4, 16, 2
NUM_STEPS = 5


class MyNNXModel(nnx.Module):
    def __init__(self, seed: int = 0):
        rngs = nnx.Rngs(seed)
        self.l1 = nnx.Linear(IN, HIDDEN, rngs=rngs)
        self.l2 = nnx.Linear(HIDDEN, OUT, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.l1(x)))


def compute_loss(logits, targets):
    return jnp.mean((logits - targets) ** 2)


_counter = {"step": 0}


def load_data_batch():
    """Deterministic batches: step k always gives the same data."""
    rng = np.random.default_rng(_counter["step"])
    _counter["step"] += 1
    x = rng.standard_normal((BATCH, IN), dtype=np.float32)
    return {"inputs": x, "targets": np.stack([x.sum(1), x[:, 0] - x[:, 1]], 1)}


@pytest.fixture(autouse=True)
def _fresh_data():
    require_devices(8)
    _counter["step"] = 0


def _params(model):
    return {k: np.asarray(v) for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def _single_device_reference(num_steps: int = NUM_STEPS):
    """The same training on one device, no mesh: the numbers every path must match."""
    _counter["step"] = 0
    model = MyNNXModel()
    optimizer = nnx.Optimizer(model, optax.adam(learning_rate=1e-3), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, batch):
        def loss_fn(model):
            return compute_loss(model(batch["inputs"]), batch["targets"])

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    dev = jax.devices()[0]
    losses = [
        float(step(model, optimizer, jax.device_put(load_data_batch(), dev)))
        for _ in range(num_steps)
    ]
    _counter["step"] = 0
    return losses, _params(model)


def assert_replicated(model, mesh):
    for path, value in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        arr = value.get_value() if hasattr(value, "get_value") else value.value
        assert arr.sharding.is_equivalent_to(NamedSharding(mesh, P()), arr.ndim), path
        assert len(arr.sharding.device_set) == mesh.size


def test_block_device_mesh_manager(capsys):
    from datarax.distributed import DeviceMeshManager

    # Create a data-parallel mesh
    mesh = DeviceMeshManager.create_data_parallel_mesh()

    # Or create a model-parallel mesh
    model_mesh = DeviceMeshManager.create_model_parallel_mesh(num_devices=4)

    # Or create a hybrid mesh
    hybrid_mesh = DeviceMeshManager.create_hybrid_mesh(
        data_parallel_size=2,
        model_parallel_size=4,
    )

    # Get information about the mesh
    mesh_info = DeviceMeshManager.get_mesh_info(mesh)
    print(f"Mesh info: {mesh_info}")

    assert mesh_info["total_devices"] == 8 and mesh_info["axes"] == {"data": 8}
    assert dict(model_mesh.shape) == {"model": 4}
    assert [d.id for d in model_mesh.devices.flat] == [0, 1, 2, 3]
    assert dict(hybrid_mesh.shape) == {"data": 2, "model": 4}
    assert hybrid_mesh.devices.shape == (2, 4)
    assert "total_devices" in capsys.readouterr().out


def test_block_data_parallel_functions():
    batch = load_data_batch()
    state = nnx.state(MyNNXModel())
    from datarax.distributed import (
        DeviceMeshManager,
        create_data_parallel_sharding,
        place_batch_on_shards,
        place_model_state_on_shards,
        reduce_gradients_across_devices,
    )

    # Create a data-parallel mesh
    mesh = DeviceMeshManager.create_data_parallel_mesh()

    # Create sharding specification for data parallelism
    sharding = create_data_parallel_sharding(mesh)

    # Shard a batch across devices
    sharded_batch = place_batch_on_shards(batch, sharding)

    # Shard model state across devices (replicated by default)
    sharded_state = place_model_state_on_shards(state, mesh)

    assert sharding == NamedSharding(mesh, P("data"))
    x = sharded_batch["inputs"]
    assert x.sharding.is_equivalent_to(sharding, 2)
    assert {s.data.shape for s in x.addressable_shards} == {(BATCH // 8, IN)}
    np.testing.assert_array_equal(np.asarray(x), batch["inputs"])
    for leaf in jax.tree.leaves(sharded_state):
        assert leaf.sharding.is_equivalent_to(NamedSharding(mesh, P()), leaf.ndim)

    # Reduce gradients across devices (only valid inside pmap/shard_map)
    per_device = jnp.arange(8.0)

    def inside(gradients):
        reduced_grads = reduce_gradients_across_devices(gradients, reduce_type="mean")
        return reduced_grads

    batch_mesh = jax.make_mesh((8,), ("batch",), axis_types=(jax.sharding.AxisType.Auto,))
    out = jax.shard_map(inside, mesh=batch_mesh, in_specs=P("batch"), out_specs=P())(per_device)
    np.testing.assert_allclose(np.asarray(out), [3.5])


def test_block_metrics_functions():
    metrics = {
        "loss": np.array([0.9, 1.1, 1.0, 1.0], np.float32),
        "accuracy": np.array([0.5, 0.6, 0.7, 0.8], np.float32),
        "step": np.array([10, 10, 10, 12]),
    }
    from datarax.distributed import (
        collect_from_devices,
        reduce_custom,
        reduce_mean,
        reduce_sum,
    )

    # Compute mean of metrics across devices (SPMD)
    reduced_metrics = reduce_mean(metrics)

    # Compute sum of metrics across devices (SPMD)
    sum_metrics = reduce_sum(metrics)

    # Apply custom per-metric reduction operations
    custom_metrics = reduce_custom(
        metrics,
        reduce_fn={
            "loss": "mean",
            "accuracy": "mean",
            "step": "max",
        },
    )

    # Split stacked per-device metrics into per-device lists
    device_metrics = collect_from_devices(metrics)

    np.testing.assert_allclose(reduced_metrics["loss"], 1.0, rtol=1e-6)
    np.testing.assert_allclose(sum_metrics["accuracy"], 2.6, rtol=1e-6)
    assert custom_metrics["step"] == 12
    np.testing.assert_allclose(custom_metrics["accuracy"], 0.65, rtol=1e-6)
    # Upstream's shape: each stacked metric becomes a list of its per-device values.
    assert set(device_metrics) == set(metrics)
    assert all(len(values) == 4 for values in device_metrics.values())
    np.testing.assert_allclose(device_metrics["loss"][3], 1.0)
    assert device_metrics["step"][3] == 12


def test_example_data_parallel_training_spmd():
    ref_losses, ref_params = _single_device_reference()
    num_steps = NUM_STEPS
    losses = []
    import flax.nnx as nnx
    import jax
    import optax

    from datarax.distributed import (
        DeviceMeshManager,
        create_data_parallel_sharding,
        place_batch_on_shards,
    )

    # Create the device mesh and data-parallel sharding
    mesh = DeviceMeshManager.create_data_parallel_mesh()
    sharding = create_data_parallel_sharding(mesh)

    # Define model and optimizer
    model = MyNNXModel()
    optimizer = nnx.Optimizer(model, optax.adam(learning_rate=1e-3), wrt=nnx.Param)

    @nnx.jit
    def train_step(model, optimizer, batch):
        def loss_fn(model):
            # Call the model directly on the batch
            logits = model(batch["inputs"])
            return compute_loss(logits, batch["targets"])

        # Compute loss and gradients; the compiler all-reduces sharded grads
        loss, grads = nnx.value_and_grad(loss_fn)(model)

        # Update parameters in place
        optimizer.update(model, grads)
        return loss

    # Train for multiple steps under the mesh context
    with jax.set_mesh(mesh):
        for step in range(num_steps):  # noqa: B007 (as in the guide)
            batch = load_data_batch()
            sharded_batch = place_batch_on_shards(batch, sharding)
            loss = train_step(model, optimizer, sharded_batch)
            losses.append(float(loss))

    assert sharded_batch["inputs"].sharding.is_equivalent_to(sharding, 2)
    assert len(sharded_batch["inputs"].sharding.device_set) == 8
    assert losses[-1] < losses[0]
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-5)
    params = _params(model)
    for path, ref in ref_params.items():
        np.testing.assert_allclose(params[path], ref, rtol=1e-4, atol=1e-6, err_msg=str(path))
    # Parameters stay replicated on all 8 devices after the updates.
    model_params = nnx.state(model, nnx.Param)
    for leaf in jax.tree.leaves(model_params):
        assert leaf.sharding.is_equivalent_to(NamedSharding(mesh, P()), leaf.ndim)
        assert len(leaf.sharding.device_set) == 8


def _mse_loss_fn(model, batch):
    return compute_loss(model(batch["inputs"]), batch["targets"])


def _run_spmd(model, optimizer, mesh, sharding, num_steps: int = NUM_STEPS) -> list[float]:
    from datarax.distributed import place_batch_on_shards, spmd_train_step

    with jax.set_mesh(mesh):
        return [
            float(
                spmd_train_step(
                    model,
                    optimizer,
                    _mse_loss_fn,
                    place_batch_on_shards(load_data_batch(), sharding),
                )
            )
            for _ in range(num_steps)
        ]


def test_spmd_train_step_equals_single_device():
    from datarax.distributed import (
        DeviceMeshManager,
        create_data_parallel_sharding,
    )

    ref_losses, ref_params = _single_device_reference()
    mesh = DeviceMeshManager.create_data_parallel_mesh()
    sharding = create_data_parallel_sharding(mesh)
    model = MyNNXModel()
    optimizer = nnx.Optimizer(model, optax.adam(learning_rate=1e-3), wrt=nnx.Param)
    losses = _run_spmd(model, optimizer, mesh, sharding)
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-5)
    params = _params(model)
    for path, ref in ref_params.items():
        np.testing.assert_allclose(params[path], ref, rtol=1e-4, atol=1e-6)
    assert_replicated(model, mesh)


def _guide_pmap_train_step(model, optimizer, batch):
    from datarax.distributed import reduce_mean_collective

    def loss_fn(model):
        logits = model(batch["inputs"])
        return compute_loss(logits, batch["targets"])

    loss, grads = nnx.value_and_grad(loss_fn)(model)

    # Average gradients across devices with a collective reduction
    grads = reduce_mean_collective(grads, axis_name="batch")

    optimizer.update(model, grads)
    return loss


def test_guide_pmap_as_written_fails_in_current_jax():
    """Documents why the guide's jax.pmap form is replaced by collective_pmap."""
    from datarax.distributed import (
        DeviceMeshManager,
        create_data_parallel_sharding,
        place_batch_on_shards,
    )

    model = MyNNXModel()
    optimizer = nnx.Optimizer(model, optax.adam(learning_rate=1e-3), wrt=nnx.Param)
    train_step = jax.pmap(_guide_pmap_train_step, axis_name="batch")
    mesh = DeviceMeshManager.create_data_parallel_mesh()
    sharding = create_data_parallel_sharding(mesh)
    sharded_batch = place_batch_on_shards(load_data_batch(), sharding)
    with pytest.raises(Exception):  # noqa: B017 (IndivisibleError or a ValueError, by version)
        train_step(model, optimizer, sharded_batch)


def test_guide_pmap_section_working_form_matches_spmd():
    from datarax.distributed import (
        DeviceMeshManager,
        collective_pmap,
        create_data_parallel_sharding,
        place_batch_on_shards,
    )

    # SPMD reference on the same data.
    mesh = DeviceMeshManager.create_data_parallel_mesh()
    sharding = create_data_parallel_sharding(mesh)
    spmd_model = MyNNXModel()
    spmd_opt = nnx.Optimizer(spmd_model, optax.adam(learning_rate=1e-3), wrt=nnx.Param)
    spmd_losses = _run_spmd(spmd_model, spmd_opt, mesh, sharding)
    _counter["step"] = 0

    # The guide's section, with jax.pmap replaced by collective_pmap.
    model = MyNNXModel()
    optimizer = nnx.Optimizer(model, optax.adam(learning_rate=1e-3), wrt=nnx.Param)
    train_step = collective_pmap(_guide_pmap_train_step, axis_name="batch")
    losses = []
    for _ in range(NUM_STEPS):
        sharded_batch = place_batch_on_shards(load_data_batch(), sharding)
        loss = train_step(model, optimizer, sharded_batch)
        assert loss.shape == (8,)  # one loss per device, as pmap returns
        losses.append(float(jnp.mean(loss)))

    np.testing.assert_allclose(losses, spmd_losses, rtol=2e-5)
    spmd_params, params = _params(spmd_model), _params(model)
    assert spmd_params.keys() == params.keys()
    for path in params:
        assert not np.allclose(params[path], _params(MyNNXModel())[path]), "no update happened"
        np.testing.assert_allclose(params[path], spmd_params[path], rtol=1e-4, atol=1e-6)
    assert_replicated(model, mesh)


def test_hybrid_data_model_step_matches_single_device():
    from datarax.distributed import (
        DeviceMeshManager,
        create_data_parallel_sharding,
        place_model_state_on_shards,
    )

    ref_losses, ref_params = _single_device_reference()
    mesh = DeviceMeshManager.create_hybrid_mesh(data_parallel_size=2, model_parallel_size=4)
    model = MyNNXModel()
    nnx.update(model, place_model_state_on_shards(nnx.state(model), mesh, "model"))
    optimizer = nnx.Optimizer(model, optax.adam(learning_rate=1e-3), wrt=nnx.Param)
    sharding = create_data_parallel_sharding(mesh)
    losses = _run_spmd(model, optimizer, mesh, sharding)
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-5)
    kernel = model.l1.kernel.get_value()
    assert kernel.sharding.is_equivalent_to(NamedSharding(mesh, P(None, "model")), 2)
    assert {s.data.shape for s in kernel.addressable_shards} == {(IN, HIDDEN // 4)}
    params = _params(model)
    for path, ref in ref_params.items():
        np.testing.assert_allclose(params[path], ref, rtol=1e-4, atol=1e-6)


def test_recommended_practices_blocks():
    from datarax.distributed import (
        DeviceMeshManager,
        collective_pmap,
        create_data_parallel_sharding,
        place_batch_on_shards,
        reduce_mean,
        reduce_mean_collective,
    )

    per_device_batch_size = 4
    batch_size = per_device_batch_size * jax.device_count()
    assert batch_size == 32

    # Consistent axis names: the collective reduction sees the pmap axis.
    def fn(values):
        reduced = reduce_mean_collective(values, axis_name="batch")
        return reduced

    values = jnp.arange(8.0)
    out = jax.pmap(fn, axis_name="batch")(values)
    np.testing.assert_allclose(np.asarray(out), np.full(8, 3.5))
    assert callable(collective_pmap(_guide_pmap_train_step, axis_name="batch"))

    mesh = DeviceMeshManager.create_data_parallel_mesh()
    sharding = create_data_parallel_sharding(mesh)
    sharded_batch = place_batch_on_shards(load_data_batch(), sharding)
    assert sharded_batch["targets"].sharding.is_equivalent_to(sharding, 2)

    @nnx.jit
    def report(batch):
        loss = jnp.mean(batch["inputs"], axis=1)
        accuracy = (batch["targets"][:, 0] > 0).astype(jnp.float32)
        metrics = {"loss": loss, "accuracy": accuracy}
        reduced_metrics = reduce_mean(metrics)
        return reduced_metrics

    with jax.set_mesh(mesh):
        got = report(sharded_batch)
    np.testing.assert_allclose(
        float(got["loss"]), float(np.mean(np.asarray(sharded_batch["inputs"]))), rtol=1e-5
    )
