"""datarax.distributed.sharding: logical axis rules (MeshRules), named parameter rules,
and the shardings they produce on 8 devices."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from datarax.distributed import sharding as distributed_sharding
from datarax.distributed.device_mesh import DeviceMeshManager
from datarax.distributed.sharding import (
    MeshRules,
    apply_sharding_rules,
    create_named_sharding,
    data_parallel_rules,
    dim0_shard_count,
    fsdp_rules,
    param_partition_spec,
    partition_spec_for_names,
)
from datarax.spmd import global_arrays
from tests.conftest import require_devices
from tests.datarax.support import placed_blocks

# ------------------------------------------------------------------ logical axis rules


def test_mesh_rules_map_logical_names_in_order():
    rules = MeshRules(data="data", mlp="model")
    assert rules("data", "embed", "mlp", "heads") == ("data", None, "model", None)
    assert rules() == ()


def test_factory_rules():
    assert data_parallel_rules() == MeshRules(data="data")
    assert data_parallel_rules("batch").data == "batch"
    fsdp = fsdp_rules(data_axis="d", model_axis="m")
    assert fsdp == MeshRules(data="d", embed="m", mlp="m", heads="m")
    assert fsdp_rules() == MeshRules(data="data", embed="model", mlp="model", heads="model")


@pytest.mark.parametrize("spec_for", [partition_spec_for_names, apply_sharding_rules])
def test_partition_spec_for_names(spec_for):
    assert spec_for(fsdp_rules(), "data", "embed") == P("data", "model")
    assert spec_for(data_parallel_rules(), "data", "mlp") == P("data", None)
    assert spec_for(fsdp_rules()) == P()


def test_mesh_rules_errors_name_the_value():
    with pytest.raises(AttributeError, match="'vocab'.*\\['data', 'embed', 'mlp', 'heads'\\]"):
        MeshRules()("data", "vocab")
    with pytest.raises(TypeError, match="MeshRules.mlp.*3"):
        MeshRules(mlp=3)
    with pytest.raises(TypeError):
        MeshRules("data")  # keyword-only, as upstream
    with pytest.raises(TypeError, match="MeshRules, got dict"):
        partition_spec_for_names({"data": "data"}, "data")
    with pytest.raises(AttributeError):
        data_parallel_rules().data = "x"  # frozen


def test_create_named_sharding_places_as_specified():
    require_devices(8)
    mesh = DeviceMeshManager.create_hybrid_mesh(2, 4)
    rules = fsdp_rules()
    sharding = create_named_sharding(mesh, *rules("data", "embed"))
    assert sharding == NamedSharding(mesh, P("data", "model"))
    x = jax.device_put(np.zeros((4, 8), np.float32), sharding)
    assert x.sharding.is_equivalent_to(NamedSharding(mesh, P("data", "model")), 2)
    grid = mesh.devices
    blocks = placed_blocks(x)
    for row in range(2):
        for col in range(4):
            assert blocks[grid[row, col].id] == ((2 * row, 2 * row + 2), (2 * col, 2 * col + 2))
    replicated = create_named_sharding(mesh)
    assert replicated.is_fully_replicated
    with pytest.raises(ValueError, match=r"\['heads'\].*\['data', 'model'\]"):
        create_named_sharding(mesh, "heads")


def test_dim0_shard_count():
    require_devices(8)
    mesh = DeviceMeshManager.create_hybrid_mesh(2, 4)
    assert dim0_shard_count(NamedSharding(mesh, P("data"))) == 2
    assert dim0_shard_count(NamedSharding(mesh, P(("data", "model")))) == 8
    assert dim0_shard_count(NamedSharding(mesh, P())) == 1
    assert dim0_shard_count(NamedSharding(mesh, P(None, "model"))) == 1
    with pytest.raises(ValueError, match="NamedSharding, got SingleDeviceSharding"):
        dim0_shard_count(jax.sharding.SingleDeviceSharding(jax.devices()[0]))


def test_placement_helpers_are_re_exported_from_global_arrays():
    # Defined below datarax.distributed, where batch placement uses them.
    assert distributed_sharding.dim0_shard_count is global_arrays.dim0_shard_count
    assert distributed_sharding.path_to_str is global_arrays.path_to_str


# ---------------------------------------------------------------- named parameter rules


def test_param_partition_spec_agrees_with_jax_placement():
    require_devices(8)
    mesh = DeviceMeshManager.create_hybrid_mesh(2, 4)
    spec, _ = param_partition_spec((16, 64), dict(mesh.shape), "model")
    x = jax.device_put(np.zeros((16, 64)), NamedSharding(mesh, P(*spec)))
    assert {s.data.shape for s in x.addressable_shards} == {(16, 16)}
