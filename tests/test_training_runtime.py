"""Training sessions in a real runtime process: correctness across meshes and strategies.

The same seed, model and synthetic data must give the same losses on every mesh and
strategy: that checks the whole sharding machinery (placement, compiled steps, gradient
reduction) against the one-device run.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from app.channel import CommandError
from app.runtime import RuntimeClient
from app.settings import Settings

FEATURES = [16, 64, 64, 8]
STEPS = 4
BATCH = 32


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    settings = Settings(
        db=tmp_path_factory.mktemp("rt") / "db.sqlite", cpu_devices=8, platforms="cpu"
    )
    loop = asyncio.new_event_loop()
    client = RuntimeClient(settings, command_modules=["app.training"])
    loop.run_until_complete(client.start())
    assert loop.run_until_complete(client.wait_ready(180)), "runtime did not become ready"

    def call(command, payload, arrays=None):
        return loop.run_until_complete(client.call(command, payload, arrays, timeout=300))

    yield call
    loop.run_until_complete(client.stop())
    loop.close()


_counter = iter(range(10_000))


def _create(call, axes, grid=None, **spec):
    n = int(np.prod(list(axes.values())))
    grid = grid if grid is not None else np.arange(n).reshape(tuple(axes.values())).tolist()
    payload = {
        "id": f"s{next(_counter)}",
        "mesh": {"axes": axes, "device_grid": grid},
        "model": {"kind": "mlp", "features": FEATURES},
        "optimizer": {"name": "adam", "learning_rate": 0.01},
        "loss": "mse",
        "seed": 0,
        "param_sharding": "replicate",
        "strategy": "spmd",
    }
    payload.update(spec)
    result, _ = call("session_create", payload)
    return payload["id"], result


def _losses(call, sid, steps=STEPS):
    result, _ = call(
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


def test_losses_equal_one_device_on_every_mesh_and_strategy(runtime):
    ref_id, _ = _create(runtime, {"data": 1})
    ref = _losses(runtime, ref_id)
    assert ref["losses"][-1] < ref["losses"][0]
    for axes, spec in CASES:
        sid, created = _create(runtime, axes, **spec)
        got = _losses(runtime, sid)
        np.testing.assert_allclose(
            got["losses"], ref["losses"], rtol=2e-4, err_msg=f"{axes} {spec}"
        )
        assert got["step"] == STEPS


def test_reported_layouts_are_real_shardings(runtime):
    sid, created = _create(runtime, {"data": 2, "model": 4}, param_sharding="model")
    by_path = {p["path"]: p for p in created["params"]}
    kernel = by_path["layers/0/kernel"]
    assert kernel["shape"] == [16, 64] and kernel["spec"] == [None, "model"]
    assert kernel["shard_shape"] == [16, 16] and kernel["bytes_per_device"] == 16 * 16 * 4
    assert by_path["layers/2/kernel"]["spec"] == [None, "model"]  # 8 outputs split over 4
    info, _ = runtime("session_info", {"id": sid})
    assert info["params"] == created["params"] and info["step"] == 0


def test_cache_hit_on_second_call_and_step_count(runtime):
    sid, _ = _create(runtime, {"data": 8})
    first = _losses(runtime, sid, 2)
    second = _losses(runtime, sid, 3)
    assert first["timing"]["cache_hit"] in (True, False)
    assert second["timing"]["cache_hit"] is True and second["timing"]["compile_s"] == 0.0
    assert second["step"] == 5 and len(second["losses"]) == 3


@pytest.mark.parametrize(
    ("arrays", "code"),
    [
        (
            {"inputs": np.zeros((8, 5), np.float32), "targets": np.zeros((8, 8), np.float32)},
            "batch_shape_mismatch",
        ),
        ({"inputs": np.zeros((8, 16), np.float32)}, "missing_targets"),
        (
            {"inputs": np.zeros((12, 16), np.float32), "targets": np.zeros((12, 8), np.float32)},
            "batch_not_divisible",
        ),
    ],
    ids=["wrong-features", "missing-targets", "indivisible"],
)
def test_bad_batches_change_nothing(runtime, arrays, code):
    sid, _ = _create(runtime, {"data": 8})
    with pytest.raises(CommandError) as err:
        runtime("session_step", {"id": sid, "steps": 1}, arrays)
    assert err.value.status == 422 and err.value.code == code
    info, _ = runtime("session_info", {"id": sid})
    assert info["step"] == 0


def test_given_batch_trains(runtime):
    sid, _ = _create(runtime, {"data": 8}, loss="cross_entropy")
    rng = np.random.default_rng(0)
    arrays = {
        "inputs": rng.standard_normal((16, 16)).astype(np.float32),
        "targets": rng.integers(0, 8, 16).astype(np.int32),
    }
    result, _ = runtime("session_step", {"id": sid, "steps": 5}, arrays)
    assert result["losses"][-1] < result["losses"][0] and result["step"] == 5


def test_unknown_session_is_lost(runtime):
    with pytest.raises(CommandError) as err:
        runtime("session_info", {"id": "nope"})
    assert err.value.status == 410 and err.value.code == "session_lost"
