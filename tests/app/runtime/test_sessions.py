"""Training sessions: in a real runtime (correctness across meshes and strategies, layouts,
refusals that change nothing) and their set-up in this process (steps: test_steps.py).

The same seed, model and synthetic data must give the same losses on every mesh and
strategy: that checks the whole sharding machinery (placement, compiled steps, gradient
reduction) against the one-device run.
"""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from app.core.errors import DevicesChanged, ServiceError
from app.runtime.compile_cache import CompiledSteps
from app.runtime.sessions import (
    Session,
    batch_sharding,
    mesh_from_plan,
    row_shards,
)
from tests.conftest import require_devices

FEATURES = [16, 64, 64, 8]
STEPS = 4
BATCH = 32

_ids = itertools.count()


def _payload(axes, sid, grid=None, features=FEATURES, **spec):
    n = int(np.prod(list(axes.values())))
    grid = grid if grid is not None else np.arange(n).reshape(tuple(axes.values())).tolist()
    payload = {
        "id": sid,
        "mesh": {"axes": axes, "device_grid": grid},
        "model": {"kind": "mlp", "features": features},
        "optimizer": {"name": "adam", "learning_rate": 0.01},
        "loss": "mse",
        "seed": 0,
        "param_sharding": "replicate",
        "strategy": "spmd",
    }
    payload.update(spec)
    return payload


def _create(runtime, axes, grid=None, **spec):
    payload = _payload(axes, f"s{next(_ids)}", grid, **spec)
    result, _ = runtime.call("session_create", payload)
    return payload["id"], result


def _losses(runtime, sid, steps=STEPS):
    result, _ = runtime.call(
        "session_step", {"id": sid, "steps": steps, "synthetic": {"seed": 3, "batch_size": BATCH}}
    )
    return result


CASES = [
    ({"data": 8}, {}),
    ({"data": 2, "model": 4}, {"param_sharding": "model"}),
    ({"data": 4, "fsdp": 2}, {"param_sharding": "fsdp"}),
    ({"data": 8}, {"strategy": "collective"}),
    ({"data": 2, "model": 4}, {"strategy": "collective"}),
]


def test_losses_equal_one_device_on_every_mesh_and_strategy(shared_runtime):
    ref_id, _ = _create(shared_runtime, {"data": 1})
    ref = _losses(shared_runtime, ref_id)
    assert ref["losses"][-1] < ref["losses"][0]
    for axes, spec in CASES:
        sid, _ = _create(shared_runtime, axes, **spec)
        got = _losses(shared_runtime, sid)
        np.testing.assert_allclose(
            got["losses"], ref["losses"], rtol=2e-4, err_msg=f"{axes} {spec}"
        )
        assert got["step"] == STEPS
        shared_runtime.call("session_delete", {"id": sid})


def test_reported_layouts_are_real_shardings(shared_runtime):
    sid, created = _create(shared_runtime, {"data": 2, "model": 4}, param_sharding="model")
    by_path = {p["path"]: p for p in created["params"]}
    kernel = by_path["layers/0/kernel"]
    assert kernel["shape"] == [16, 64] and kernel["spec"] == [None, "model"]
    assert kernel["shard_shape"] == [16, 16] and kernel["bytes_per_device"] == 16 * 16 * 4
    assert by_path["layers/2/kernel"]["spec"] == [None, "model"]  # 8 outputs split over 4
    info, _ = shared_runtime.call("session_info", {"id": sid})
    assert info["params"] == created["params"] and info["step"] == 0
    assert shared_runtime.call("session_delete", {"id": sid})[0] == {"deleted": True}
    assert shared_runtime.call("session_delete", {"id": sid})[0] == {"deleted": False}


@pytest.mark.parametrize(
    ("payload", "status", "code"),
    [
        (_payload({"data": 8}, "x", strategy="collective", param_sharding="fsdp"), 422,
         "invalid_strategy"),
        (_payload({"data": 2}, "x", grid=[0, 99]), 409, "devices_changed"),
    ],
    ids=["collective-sharded", "missing-device"],
)  # fmt: skip
def test_refused_sessions(shared_runtime, payload, status, code):
    with pytest.raises(ServiceError) as err:
        shared_runtime.call("session_create", payload)
    assert (err.value.status, err.value.code) == (status, code)
    with pytest.raises(ServiceError) as lost:  # it was not created
        shared_runtime.call("session_info", {"id": "x"})
    assert lost.value.code == "session_lost"


def test_unknown_session_is_lost(shared_runtime):
    for command in ("session_info", "session_step"):
        with pytest.raises(ServiceError) as err:
            shared_runtime.call(command, {"id": "nope", "steps": 1})
        assert err.value.status == 410 and err.value.code == "session_lost"


# ---------------------------------------------------------------- checks in this process


def _session(axes: dict[str, int], loss: str = "mse", features=(16, 8)) -> Session:
    require_devices(8)
    n = int(np.prod(list(axes.values())))
    mesh = jax.make_mesh(tuple(axes.values()), tuple(axes), devices=jax.devices()[:n])
    return Session(
        id="s",
        features=tuple(features),
        loss=loss,
        strategy="spmd",
        param_sharding="replicate",
        optimizer=("adam", 0.01),
        mesh=mesh,
        batch_sharding=batch_sharding(mesh, "spmd", None),
        graphdef=None,
        state=None,
        state_shardings=None,
    )


def test_mesh_from_plan_places_the_plans_devices():
    require_devices(8)
    mesh = mesh_from_plan({"axes": {"data": 2, "model": 2}, "device_grid": [[6, 7], [4, 5]]})
    assert mesh.axis_names == ("data", "model")
    assert [d.id for d in mesh.devices.flat] == [6, 7, 4, 5]
    with pytest.raises(DevicesChanged, match=r"\[99\]") as err:
        mesh_from_plan({"axes": {"data": 2}, "device_grid": [0, 99]})
    assert (err.value.status, err.value.code) == (409, "devices_changed")


@pytest.mark.parametrize(
    ("axes", "strategy", "batch_axes", "spec", "shards"),
    [
        ({"data": 2, "model": 4}, "spmd", None, P("data"), 2),
        ({"data": 2, "fsdp": 4}, "spmd", None, P(("data", "fsdp")), 8),
        ({"model": 8}, "spmd", None, P(), 1),
        ({"data": 2, "model": 4}, "spmd", ["model"], P("model"), 4),
        ({"data": 2, "model": 4}, "collective", None, P(("data", "model")), 8),
    ],
    ids=["data", "data-fsdp", "replicated", "batch-axes", "collective"],
)
def test_batch_sharding_and_row_shards(axes, strategy, batch_axes, spec, shards):
    require_devices(8)
    mesh = jax.make_mesh(tuple(axes.values()), tuple(axes))
    sharding = batch_sharding(mesh, strategy, batch_axes)
    assert isinstance(sharding, NamedSharding) and sharding.spec == spec
    assert row_shards(sharding) == shards


def test_compiled_steps_keep_the_most_recently_used():
    cache = CompiledSteps(max_entries=2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a is now the most recent
    cache.put("c", 3)
    assert "b" not in cache and cache.get("a") == 1 and cache.get("c") == 3
    assert cache.get("b") is None and len(cache) == 2
    with pytest.raises(ValueError, match="at least 1"):
        CompiledSteps(max_entries=0)
