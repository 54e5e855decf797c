"""DeviceMeshManager, batch and model-state placement, sharding rules."""

from __future__ import annotations

import flax.nnx as nnx
import jax
import numpy as np
import pytest
from conftest import require_devices
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from datarax.distributed import (
    DeviceMeshManager,
    PlanError,
    create_data_parallel_sharding,
    param_partition_spec,
    place_batch_on_shards,
    place_model_state_on_shards,
    reduce_gradients_across_devices,
)
from datarax.models import MLP


@pytest.fixture(autouse=True)
def _eight():
    require_devices(8)


@pytest.mark.parametrize(
    ("shape", "axes"),
    [
        ({"data": 8}, {"data": 8}),
        ([("data", 2), ("model", 4)], {"data": 2, "model": 4}),
        ({"data": -1, "model": 2}, {"data": 4, "model": 2}),
        ({"data": 2, "fsdp": 2, "model": 2}, {"data": 2, "fsdp": 2, "model": 2}),
        ({"model": 4}, {"model": 4}),
    ],
    ids=["data8", "pairs-2x4", "auto-data", "3d", "fewer-devices"],
)
def test_create_device_mesh(shape, axes):
    mesh = DeviceMeshManager.create_device_mesh(shape)
    assert dict(mesh.shape) == axes
    assert list(mesh.axis_names) == list(axes)
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
    info = DeviceMeshManager.get_mesh_info(mesh)
    assert info["total_devices"] == int(np.prod(list(axes.values())))
    assert info["axes"] == axes
    assert info["platform"] == "cpu" and info["process_count"] == 1
    assert np.asarray(info["device_ids"]).shape == tuple(axes.values())


def test_too_many_devices_names_both_numbers():
    with pytest.raises(ValueError, match=r"16.*8") as err:
        DeviceMeshManager.create_hybrid_mesh(data_parallel_size=4, model_parallel_size=4)
    assert isinstance(err.value, PlanError) and err.value.code == "not_enough_devices"


def test_explicit_axis_types_on_request():
    explicit = jax.sharding.AxisType.Explicit
    mesh = DeviceMeshManager.create_device_mesh({"data": 8}, axis_types=(explicit,))
    assert mesh.axis_types == (explicit,)


def test_place_batch_numpy_and_jax_and_passthrough():
    mesh = DeviceMeshManager.create_data_parallel_mesh()
    sharding = create_data_parallel_sharding(mesh)
    batch = {
        "inputs": np.ones((16, 3), np.float32),
        "targets": jax.numpy.arange(16),
        "scale": np.array(2.0, np.float32),
        "name": "epoch-1",
        "count": 7,
    }
    out = place_batch_on_shards(batch, sharding)
    for key in ("inputs", "targets"):
        assert out[key].sharding.is_equivalent_to(sharding, out[key].ndim)
        assert out[key].addressable_shards[0].data.shape[0] == 2
        assert len(out[key].sharding.device_set) == 8
    assert out["scale"].sharding.is_equivalent_to(NamedSharding(mesh, P()), 0)
    assert out["name"] == "epoch-1" and out["count"] == 7


def test_place_batch_indivisible_names_leaf_shape_and_sizes():
    sharding = create_data_parallel_sharding(DeviceMeshManager.create_data_parallel_mesh())
    with pytest.raises(ValueError) as err:
        place_batch_on_shards({"inputs": np.zeros((250, 4))}, sharding)
    msg = str(err.value)
    for part in ("'inputs'", "(250, 4)", "8 shards", "248", "256"):
        assert part in msg


def test_create_data_parallel_sharding_unknown_axis():
    mesh = DeviceMeshManager.create_model_parallel_mesh(4)
    with pytest.raises(ValueError, match="'data'"):
        create_data_parallel_sharding(mesh)


RULE_CASES = [
    ("replicate", (16, 64), {"model": 4}, (None, None), None),
    ("model", (16, 64), {"data": 2, "model": 4}, (None, "model"), None),
    ("model", (64,), {"model": 4}, ("model",), None),
    ("model", (16, 6), {"model": 4}, ("model", None), None),
    ("model", (6, 6), {"model": 4}, (None, None), "divisible"),
    ("model", (16, 64), {"data": 8}, (None, None), "no 'model' axis"),
    ("fsdp", (16, 64), {"data": 4, "fsdp": 2}, ("fsdp", None), None),
    ("fsdp", (3, 64), {"fsdp": 2}, (None, "fsdp"), None),
    ("fsdp", (), {"fsdp": 2}, (), None),
]


@pytest.mark.parametrize(
    ("rule", "shape", "axes", "spec", "warning"),
    RULE_CASES,
    ids=[f"{c[0]}-{c[1]}-{'x'.join(c[2])}" for c in RULE_CASES],
)
def test_param_partition_spec(rule, shape, axes, spec, warning):
    got, warn = param_partition_spec(shape, axes, rule, "p")
    assert got == spec
    if warning is None:
        assert warn is None
    else:
        assert warning in warn


def test_unknown_rule_is_value_error():
    with pytest.raises(ValueError, match="unknown param_sharding"):
        param_partition_spec((4, 4), {"model": 2}, "tensor")


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


def test_reduce_gradients_sum_and_bad_type():
    mesh = jax.make_mesh((8,), ("batch",), axis_types=(jax.sharding.AxisType.Auto,))
    grads = {"w": jax.numpy.arange(8.0)}
    summed = jax.shard_map(
        lambda g: reduce_gradients_across_devices(g, "sum"),
        mesh=mesh,
        in_specs=P("batch"),
        out_specs=P(),
    )(grads)
    np.testing.assert_allclose(np.asarray(summed["w"]), [28.0])
    with pytest.raises(ValueError, match="'max'"):
        reduce_gradients_across_devices(grads, reduce_type="max")
