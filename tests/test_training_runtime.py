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
    yield from _running(tmp_path_factory)


def _running(tmp_path_factory, **overrides):
    settings = Settings(
        db=tmp_path_factory.mktemp("rt") / "db.sqlite", cpu_devices=8, platforms="cpu", **overrides
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


def _create(call, axes, grid=None, **spec):
    payload = _payload(axes, f"s{next(_counter)}", grid, **spec)
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


# ------------------------------------------------------------------ memory admission

# MLP [16, 64, 64, 8]: 5,768 float32 parameters = 23,072 bytes. Replicated on 8 CPU
# devices with adam and no donation (CPU), a session reserves per device params +
# 2 adam slots + gradients + the next state (7 copies), plus the whole model once while it
# is initialised: 8 * 7 * 23,072 + 23,072 = 1,315,104 bytes.
SESSION_BYTES = 8 * 7 * 23_072 + 23_072
BUDGET_MB = 3  # two such sessions fit (2.51 MiB), a third does not


@pytest.fixture(scope="module")
def small_runtime(tmp_path_factory):
    yield from _running(tmp_path_factory, memory_budget_mb=BUDGET_MB)


def _refused(call, command, payload, arrays=None) -> CommandError:
    with pytest.raises(CommandError) as err:
        call(command, payload, arrays)
    assert err.value.status == 422 and err.value.code == "insufficient_memory"
    return err.value


def test_sessions_are_admitted_against_the_memory_budget(small_runtime):
    assert 2 * SESSION_BYTES <= BUDGET_MB * 2**20 < 3 * SESSION_BYTES
    first, _ = _create(small_runtime, {"data": 8})
    second, _ = _create(small_runtime, {"data": 8})
    err = _refused(small_runtime, "session_create", _payload({"data": 8}, "third"))
    assert "needs about 1.25 MiB of host memory" in str(err)
    assert "sessions hold 2.51 MiB of its 3.00 MiB budget" in str(err)
    assert "delete sessions" in str(err)
    with pytest.raises(CommandError) as lost:  # the refused session does not exist
        small_runtime("session_info", {"id": "third"})
    assert lost.value.code == "session_lost"
    # fsdp over 8 devices splits the kernels: the same model now needs far less.
    sharded, created = _create(small_runtime, {"fsdp": 8}, param_sharding="fsdp")
    assert created["params"][0]["shard_shape"] != created["params"][0]["shape"]
    small_runtime("session_delete", {"id": sharded})
    # Deleting a session returns its reservation.
    small_runtime("session_delete", {"id": second})
    _create(small_runtime, {"data": 8})
    small_runtime("session_delete", {"id": first})


def test_a_step_that_would_not_fit_changes_nothing(small_runtime):
    sid, _ = _create(small_runtime, {"data": 8})
    ok, _ = small_runtime(
        "session_step", {"id": sid, "steps": 2, "synthetic": {"seed": 0, "batch_size": 32}}
    )
    # 4,096 rows: 512 per device x (2 x 152 + 24) floats x 8 devices ~ 5.4 MB of activations.
    _refused(
        small_runtime,
        "session_step",
        {"id": sid, "steps": 1, "synthetic": {"seed": 0, "batch_size": 4096}},
    )
    big = {
        "inputs": np.zeros((4096, 16), np.float32),
        "targets": np.zeros((4096, 8), np.float32),
    }
    _refused(small_runtime, "session_step", {"id": sid, "steps": 1}, big)
    info, _ = small_runtime("session_info", {"id": sid})
    assert info["step"] == ok["step"] == 2
    small_runtime("session_delete", {"id": sid})


def test_default_budget_refuses_a_model_the_host_cannot_hold(runtime):
    # [65536, 65536] is 4.3e9 parameters, 17 GiB per copy: without admission this
    # session got the runtime killed by the kernel (found by schemathesis).
    err = _refused(
        runtime, "session_create", _payload({"data": 8}, "huge", features=[65536, 65536])
    )
    assert "host memory" in str(err)


def test_the_budget_sent_with_a_command_wins_over_the_local_one(runtime):
    # Multi-host processes must decide alike: they use the leader's budget carried in
    # the payload, not their own host's.
    payload = _payload({"data": 8}, "tiny-budget", memory_budget={"host": 10_000, "device": None})
    err = _refused(runtime, "session_create", payload)
    assert "of its 0.01 MiB budget" in str(err)
    sid, _ = _create(runtime, {"data": 8})  # the local default admits the same session
    runtime("session_delete", {"id": sid})
