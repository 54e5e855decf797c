"""datarax.distributed.data_parallel: batch and model-state placement on 8 devices,
asserted through the arrays' own shardings."""

from __future__ import annotations

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import datarax.distributed as dd
from datarax.distributed import data_parallel
from datarax.distributed.data_parallel import (
    create_data_parallel_sharding,
    place_batch_on_shards,
    place_model_state_on_shards,
    place_nnx_state_on_shards,
    reduce_gradient_tree,
)
from datarax.distributed.device_mesh import DeviceMeshManager
from datarax.distributed.sharding import param_partition_spec
from datarax.models import MLP
from datarax.spmd import collectives, global_arrays, multihost, train_step
from tests.conftest import require_devices
from tests.datarax.support import placed_blocks


@pytest.fixture(autouse=True)
def _eight():
    require_devices(8)


def test_create_data_parallel_sharding():
    mesh = DeviceMeshManager.create_hybrid_mesh(2, 4)
    sharding = create_data_parallel_sharding(mesh)
    assert sharding == NamedSharding(mesh, P("data"))
    custom = create_data_parallel_sharding(mesh, data_axis="model")
    assert custom.spec == P("model")


def test_create_data_parallel_sharding_unknown_axis():
    mesh = DeviceMeshManager.create_model_parallel_mesh(4)
    with pytest.raises(ValueError, match="'data'.*\\['model'\\]"):
        create_data_parallel_sharding(mesh)


def test_place_batch_numpy_and_jax_and_passthrough():
    mesh = DeviceMeshManager.create_data_parallel_mesh()
    sharding = create_data_parallel_sharding(mesh)
    batch = {
        "inputs": np.arange(48, dtype=np.float32).reshape(16, 3),
        "targets": jax.numpy.arange(16),
        "scale": np.array(2.0, np.float32),
        "name": "epoch-1",
        "count": 7,
    }
    out = place_batch_on_shards(batch, sharding)
    for key in ("inputs", "targets"):
        assert out[key].sharding.is_equivalent_to(sharding, out[key].ndim)
        assert len(out[key].sharding.device_set) == 8
        np.testing.assert_array_equal(np.asarray(out[key]), np.asarray(batch[key]))
    blocks = placed_blocks(out["inputs"])
    assert blocks == {d.id: ((2 * i, 2 * i + 2), (0, 3)) for i, d in enumerate(mesh.devices.flat)}
    for shard in out["inputs"].addressable_shards:
        start = blocks[shard.device.id][0][0]
        np.testing.assert_array_equal(np.asarray(shard.data), batch["inputs"][start : start + 2])
    assert out["scale"].sharding.is_equivalent_to(NamedSharding(mesh, P()), 0)
    assert out["name"] == "epoch-1" and out["count"] == 7


def test_place_batch_on_a_hybrid_mesh_replicates_over_model():
    mesh = DeviceMeshManager.create_hybrid_mesh(2, 4)
    out = place_batch_on_shards({"x": np.zeros((6, 2))}, create_data_parallel_sharding(mesh))
    blocks = placed_blocks(out["x"])
    grid = mesh.devices
    for row in range(2):
        for col in range(4):
            assert blocks[grid[row, col].id] == ((3 * row, 3 * row + 3), (0, 2))


def test_place_batch_indivisible_names_leaf_shape_and_sizes():
    sharding = create_data_parallel_sharding(DeviceMeshManager.create_data_parallel_mesh())
    with pytest.raises(ValueError) as err:
        place_batch_on_shards({"inputs": np.zeros((250, 4))}, sharding)
    msg = str(err.value)
    for part in ("'inputs'", "(250, 4)", "8 shards", "248", "256"):
        assert part in msg


@pytest.mark.parametrize("rule", ["replicate", "model", "fsdp"])
def test_place_model_state_rules_on_nnx_state(rule):
    mesh = DeviceMeshManager.create_device_mesh({"data": 2, "fsdp": 2, "model": 2})
    model = MLP([8, 16, 4], rngs=nnx.Rngs(0))
    state = nnx.state(model)
    placed = place_model_state_on_shards(state, mesh, rule)
    assert type(placed) is type(state)
    axes = dict(mesh.shape)
    for (path, leaf), (_, orig) in zip(
        jax.tree_util.tree_flatten_with_path(placed)[0],
        jax.tree_util.tree_flatten_with_path(state)[0],
        strict=True,
    ):
        spec, _ = param_partition_spec(leaf.shape, axes, rule)
        assert leaf.sharding.is_equivalent_to(NamedSharding(mesh, P(*spec)), leaf.ndim), path
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(orig))


def test_place_model_state_dict_of_specs_and_plain_pytree():
    mesh = DeviceMeshManager.create_hybrid_mesh(2, 4)
    tree = {"layers": {"0": {"kernel": np.zeros((8, 16)), "bias": np.zeros(16)}}}
    placed = place_model_state_on_shards(tree, mesh, {"layers/0/kernel": P(None, "model")})
    kernel, bias = placed["layers"]["0"]["kernel"], placed["layers"]["0"]["bias"]
    assert kernel.sharding.is_equivalent_to(NamedSharding(mesh, P(None, "model")), 2)
    assert {s.data.shape for s in kernel.addressable_shards} == {(8, 4)}
    assert bias.sharding.is_equivalent_to(NamedSharding(mesh, P()), 1)
    with pytest.raises(ValueError, match="not in the state"):
        place_model_state_on_shards(tree, mesh, {"layers/9/kernel": P("model")})


def test_place_nnx_state_on_shards_by_filter():
    mesh = DeviceMeshManager.create_hybrid_mesh(2, 4)
    model = MLP([8, 16, 4], rngs=nnx.Rngs(0))
    state = nnx.state(model)
    kernels = nnx.All(nnx.Param, nnx.PathContains("kernel"))
    placed = place_nnx_state_on_shards(state, mesh, {kernels: P(None, "model"), ...: P()})
    assert isinstance(placed, nnx.State)
    for path, variable in nnx.to_flat_state(placed):
        value = variable[...]
        expected = P(None, "model") if path[-1] == "kernel" else P()
        assert value.sharding.is_equivalent_to(NamedSharding(mesh, expected), value.ndim), path
    kernel = placed["layers"][0]["kernel"][...]
    assert {s.data.shape for s in kernel.addressable_shards} == {(8, 4)}
    np.testing.assert_array_equal(np.asarray(kernel), np.asarray(model.layers[0].kernel[...]))
    nnx.update(model, placed)
    assert (
        model.layers[0]
        .kernel[...]
        .sharding.is_equivalent_to(NamedSharding(mesh, P(None, "model")), 2)
    )


def test_place_nnx_state_accepts_a_state_sharding_and_sharding_objects():
    mesh = DeviceMeshManager.create_data_parallel_mesh()
    state = nnx.state(MLP([8, 4], rngs=nnx.Rngs(0)))
    rules = nnx.StateSharding({nnx.Param: NamedSharding(mesh, P())})
    placed = place_nnx_state_on_shards(state, mesh, rules)
    for _, variable in nnx.to_flat_state(placed):
        assert len(variable[...].sharding.device_set) == 8


def test_place_nnx_state_unmatched_variable_names_its_path():
    mesh = DeviceMeshManager.create_data_parallel_mesh()
    state = nnx.state(MLP([8, 4], rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match=r"layers/0/(bias|kernel).*\.\.\.: PartitionSpec"):
        place_nnx_state_on_shards(state, mesh, {nnx.PathContains("nothing"): P()})


def test_reduce_gradient_tree_mean_and_sum_per_leaf():
    grads = {"w": jnp.array([[1.0, 2.0], [3.0, 6.0]]), "b": jnp.array([4.0, 6.0])}
    mean = reduce_gradient_tree(grads, "mean")
    assert mean["w"].shape == () and float(mean["w"]) == 3.0 and float(mean["b"]) == 5.0
    assert float(reduce_gradient_tree(grads, reduce_type="SUM")["w"]) == 12.0
    with pytest.raises(ValueError, match="Unsupported reduce_type 'max'"):
        reduce_gradient_tree(grads, "max")


def test_reduce_gradient_tree_on_sharded_arrays_under_jit():
    mesh = DeviceMeshManager.create_data_parallel_mesh()
    g = jax.device_put(jnp.arange(16.0), create_data_parallel_sharding(mesh))
    with jax.set_mesh(mesh):
        out = jax.jit(reduce_gradient_tree)({"g": g})
    assert float(out["g"]) == 7.5 and out["g"].sharding.is_fully_replicated


def test_steps_and_gradient_reduction_are_importable_from_data_parallel():
    # Upstream keeps these in data_parallel; ours live in global_arrays, train_step and
    # collectives (below datarax.spmd.multihost, which places batches too).
    assert data_parallel.place_batch_on_shards is global_arrays.place_batch_on_shards
    assert multihost.place_batch_on_shards is global_arrays.place_batch_on_shards
    assert dd.place_batch_on_shards is global_arrays.place_batch_on_shards
    assert data_parallel.spmd_train_step is train_step.spmd_train_step
    assert data_parallel.data_parallel_train_step is train_step.data_parallel_train_step
    assert (
        data_parallel.reduce_gradients_across_devices is collectives.reduce_gradients_across_devices
    )
