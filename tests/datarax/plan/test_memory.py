"""datarax.plan.memory: the built-in MLP's layouts and bytes per device, checked
against a real model and real placements."""

from __future__ import annotations

import math

import flax.nnx as nnx
import jax
import numpy as np
import pytest

from datarax.answers.estimates import MemoryPerDevice
from datarax.answers.plans import ParamLayout
from datarax.distributed.data_parallel import place_model_state_on_shards
from datarax.distributed.device_mesh import DeviceMeshManager
from datarax.distributed.sharding import path_to_str
from datarax.models import MLP
from datarax.plan.memory import (
    BYTES_PER_ELEMENT,
    OPTIMIZER_STATE_FACTOR,
    memory_per_device,
    mlp_param_shapes,
    param_layouts,
)
from tests.conftest import require_devices

FEATURES = [16, 64, 8]


def test_mlp_param_shapes_match_a_built_model():
    shapes = mlp_param_shapes(FEATURES)
    assert [p for p, _ in shapes] == [
        "layers/0/kernel",
        "layers/0/bias",
        "layers/1/kernel",
        "layers/1/bias",
    ]
    model = MLP(FEATURES, rngs=nnx.Rngs(0))
    built = {
        path_to_str(path): tuple(leaf.shape)
        for path, leaf in jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param))[0]
    }
    assert dict(shapes) == built


@pytest.mark.parametrize("features", [[4], [4, 0], []], ids=["one", "zero", "empty"])
def test_mlp_param_shapes_rejects_bad_features(features):
    with pytest.raises(ValueError, match="at least 2 positive sizes"):
        mlp_param_shapes(features)


@pytest.mark.parametrize("rule", ["replicate", "model", "fsdp"])
def test_param_layouts_predict_real_placement(rule):
    require_devices(8)
    mesh = DeviceMeshManager.create_device_mesh({"data": 2, "fsdp": 2, "model": 2})
    entries, warnings = param_layouts(FEATURES, dict(mesh.shape), rule)
    assert warnings == []
    state = nnx.state(MLP(FEATURES, rngs=nnx.Rngs(0)), nnx.Param)
    placed = place_model_state_on_shards(state, mesh, rule)
    real = {
        path_to_str(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(placed)[0]
    }
    for entry in entries:
        leaf = real[entry["path"]]
        assert entry["shape"] == list(leaf.shape)
        block = leaf.sharding.shard_shape(leaf.shape)
        assert entry["shard_shape"] == list(block), entry["path"]
        assert entry["bytes_per_device"] == math.prod(block) * leaf.dtype.itemsize


def test_param_layouts_warn_when_a_rule_cannot_split():
    entries, warnings = param_layouts([6, 6], {"model": 4}, "model")
    assert all(entry["spec"] == [None] * len(entry["shape"]) for entry in entries)
    assert len(warnings) == 2 and "divisible" in warnings[0]


def test_memory_per_device_adds_params_optimizer_and_batch():
    entries, _ = param_layouts(FEATURES, {"data": 2, "model": 4}, "model")
    params = sum(e["bytes_per_device"] for e in entries)
    out = memory_per_device(entries, "adam", [8, 16])
    assert out == {
        "params": params,
        "optimizer": 2 * params,
        "batch": 8 * 16 * BYTES_PER_ELEMENT,
        "total": 3 * params + 8 * 16 * BYTES_PER_ELEMENT,
    }
    assert memory_per_device(entries, "sgd", None)["total"] == params
    assert memory_per_device([], "adamw", None) == dict.fromkeys(
        ("params", "optimizer", "batch", "total"), 0
    )


def test_layouts_and_memory_are_the_plans_answer_parts():
    entries, _ = param_layouts(FEATURES, {"data": 2, "model": 4}, "model")
    assert all(isinstance(entry, ParamLayout) for entry in entries)
    assert entries[0].to_json() == {
        "path": "layers/0/kernel",
        "shape": [FEATURES[0], FEATURES[1]],
        "spec": [None, "model"],
        "shard_shape": [FEATURES[0], FEATURES[1] // 4],
        "bytes_per_device": FEATURES[0] * FEATURES[1] // 4 * BYTES_PER_ELEMENT,
    }  # no repeat: a hardware plan's member
    memory = memory_per_device(entries, "adam", None)
    assert isinstance(memory, MemoryPerDevice) and list(memory.to_json()) == [
        "params",
        "optimizer",
        "batch",
        "total",
    ]


def test_optimizer_state_factor_matches_optax_state_size():
    import optax

    params = {"w": np.zeros((4, 8), np.float32)}
    for name, factor in OPTIMIZER_STATE_FACTOR.items():
        state = getattr(optax, name)(1e-3).init(params)
        float_bytes = sum(
            x.nbytes for x in jax.tree.leaves(state) if np.asarray(x).ndim and x.dtype.kind == "f"
        )
        assert float_bytes == factor * params["w"].nbytes, name


def test_memory_per_device_unknown_optimizer():
    with pytest.raises(ValueError, match="'lion'.*adam"):
        memory_per_device([], "lion", None)
