"""Memory admission: the arithmetic in this process, and refusals in a real runtime that
change nothing.

MLP [16, 64, 64, 8]: 5,768 float32 parameters = 23,072 bytes. Replicated on 8 CPU devices
with adam and no donation (CPU), a session reserves per device params + 2 adam slots +
gradients + the next state (7 copies), plus the whole model once while it is initialised:
8 * 7 * 23,072 + 23,072 = 1,315,104 bytes.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from app.core.errors import InsufficientMemory, ServiceError
from app.runtime.admission import admit, pool_budget, pool_of, session_need, step_need
from tests.conftest import require_devices

FEATURES = [16, 64, 64, 8]
MODEL_BYTES = 23_072
SESSION_BYTES = 8 * 7 * MODEL_BYTES + MODEL_BYTES
BUDGET_MB = 3  # two such sessions fit (2.51 MiB), a third does not

_ids = itertools.count()


def _cpu_mesh(axes: dict[str, int]):
    require_devices(8)
    return jax.make_mesh(tuple(axes.values()), tuple(axes))


def _accelerators(n: int, per_process: int):
    """A stand-in mesh of ``n`` accelerators, ``per_process`` on each process."""
    devices = [
        SimpleNamespace(platform="gpu", id=i, process_index=i // per_process) for i in range(n)
    ]
    return SimpleNamespace(shape={"data": n}, devices=np.array(devices, dtype=object))


# ------------------------------------------------------------------ the arithmetic


def test_session_need_on_cpu_devices_is_one_host_pool():
    mesh = _cpu_mesh({"data": 8})
    assert session_need(mesh, FEATURES, "replicate", "adam", donate=False) == {
        ("host", 0): SESSION_BYTES
    }
    donated = session_need(mesh, FEATURES, "replicate", "adam", donate=True)
    assert donated == {("host", 0): 8 * 4 * MODEL_BYTES + MODEL_BYTES}
    sgd = session_need(mesh, FEATURES, "replicate", "sgd", donate=False)
    assert sgd == {("host", 0): 8 * 3 * MODEL_BYTES + MODEL_BYTES}
    sharded = session_need(_cpu_mesh({"fsdp": 8}), FEATURES, "fsdp", "adam", donate=False)
    assert sharded[("host", 0)] < SESSION_BYTES / 2


def test_session_need_on_accelerators_is_per_device_plus_one_model_per_process():
    mesh = _accelerators(4, per_process=2)
    need = session_need(mesh, FEATURES, "replicate", "adam", donate=True)
    per_device = 4 * MODEL_BYTES  # params, 2 adam slots, gradients; donated state
    assert need == {
        ("device", 0): per_device + MODEL_BYTES,  # first device of process 0
        ("device", 1): per_device,
        ("device", 2): per_device + MODEL_BYTES,  # first device of process 1
        ("device", 3): per_device,
    }


def test_step_need_counts_shards_activations_and_the_host_batch():
    mesh = _cpu_mesh({"data": 8})
    # 4,096 rows over 8 shards: 512 rows x (2 x 152 + 16 + 8) floats on each device, plus
    # the host copy of the batch (4,096 x (16 + 8) floats).
    per_device = 512 * (2 * 152 + 24) * 4
    assert step_need(mesh, 8, FEATURES, 4096) == {("host", 0): 8 * per_device + 4096 * 24 * 4}
    gpus = step_need(_accelerators(2, per_process=2), 2, FEATURES, 64)
    assert gpus == {("device", 0): 32 * 328 * 4, ("device", 1): 32 * 328 * 4}  # no host copy


def test_pools_and_budgets():
    assert pool_of(SimpleNamespace(platform="cpu", id=5, process_index=1)) == ("host", 1)
    assert pool_of(SimpleNamespace(platform="tpu", id=5, process_index=1)) == ("device", 5)
    budgets = {"host": 100, "device": None}
    assert pool_budget(("device", 3), budgets) == 100  # no accelerator budget: the host's
    assert pool_budget(("device", 3), {"host": 100, "device": 40}) == 40


def test_admit_counts_every_reservation_of_the_pool():
    budgets = {"host": 3 * 2**20, "device": None}
    held = [{("host", 0): 2**20}, {("host", 0): 2**20, ("host", 1): 5 * 2**20}]
    admit("a session", {("host", 0): 2**20}, budgets, held)  # exactly the budget: fits
    with pytest.raises(InsufficientMemory) as err:
        admit("a session of MLP [4, 2]", {("host", 0): 2**20 + 1}, budgets, held)
    assert (err.value.status, err.value.code) == (422, "insufficient_memory")
    message = str(err.value)
    assert message.startswith("a session of MLP [4, 2] needs about 1.00 MiB of host memory")
    assert "(process 0, shared by its CPU devices)" in message
    assert "sessions hold 2.00 MiB of its 3.00 MiB budget" in message
    assert "DATARAX_MEMORY_FRACTION" in message
    with pytest.raises(InsufficientMemory, match="of device 7; sessions hold 0.00 MiB"):
        admit("a step", {("device", 7): 2**31}, {"host": 2**40, "device": 2**30}, held)


# ------------------------------------------------------------------ in a real runtime


def _payload(axes, sid, features=FEATURES, **spec):
    n = int(np.prod(list(axes.values())))
    payload = {
        "id": sid,
        "mesh": {"axes": axes, "device_grid": np.arange(n).reshape(tuple(axes.values())).tolist()},
        "model": {"kind": "mlp", "features": features},
        "optimizer": {"name": "adam", "learning_rate": 0.01},
        "loss": "mse",
    }
    payload.update(spec)
    return payload


def _create(runtime, axes, **spec) -> tuple[str, dict]:
    payload = _payload(axes, f"a{next(_ids)}", **spec)
    return payload["id"], runtime.call("session_create", payload)[0]


def _refused(runtime, command, payload, arrays=None) -> ServiceError:
    with pytest.raises(ServiceError) as err:
        runtime.call(command, payload, arrays)
    assert err.value.status == 422 and err.value.code == "insufficient_memory"
    return err.value


@pytest.fixture
def small_runtime(start_runtime):
    return start_runtime(memory_budget_mb=BUDGET_MB)


def test_sessions_are_admitted_against_the_memory_budget(small_runtime):
    assert 2 * SESSION_BYTES <= BUDGET_MB * 2**20 < 3 * SESSION_BYTES
    first, _ = _create(small_runtime, {"data": 8})
    second, _ = _create(small_runtime, {"data": 8})
    err = _refused(small_runtime, "session_create", _payload({"data": 8}, "third"))
    assert "needs about 1.25 MiB of host memory" in str(err)
    assert "sessions hold 2.51 MiB of its 3.00 MiB budget" in str(err)
    assert "delete sessions" in str(err)
    with pytest.raises(ServiceError) as lost:  # the refused session does not exist
        small_runtime.call("session_info", {"id": "third"})
    assert lost.value.code == "session_lost"
    # fsdp over 8 devices splits the kernels: the same model now needs far less.
    sharded, created = _create(small_runtime, {"fsdp": 8}, param_sharding="fsdp")
    assert created["params"][0]["shard_shape"] != created["params"][0]["shape"]
    small_runtime.call("session_delete", {"id": sharded})
    # Deleting a session returns its reservation.
    small_runtime.call("session_delete", {"id": second})
    _create(small_runtime, {"data": 8})
    small_runtime.call("session_delete", {"id": first})

    # A step that would not fit changes nothing.
    sid, _ = _create(small_runtime, {"data": 8})
    ok, _ = small_runtime.call(
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
    err = _refused(small_runtime, "session_step", {"id": sid, "steps": 1}, big)
    assert "a step of batch size 4096" in str(err)
    info, _ = small_runtime.call("session_info", {"id": sid})
    assert info["step"] == ok["step"] == 2


def test_default_budget_refuses_a_model_the_host_cannot_hold(shared_runtime):
    # [65536, 65536] is 4.3e9 parameters, 17 GiB per copy: without admission this
    # session got the runtime killed by the kernel (found by schemathesis).
    err = _refused(
        shared_runtime, "session_create", _payload({"data": 8}, "huge", features=[65536, 65536])
    )
    assert "host memory" in str(err)


def test_the_budget_sent_with_a_command_wins_over_the_local_one(shared_runtime):
    # Multi-host processes must decide alike: they use the leader's budget carried in
    # the payload, not their own host's.
    payload = _payload({"data": 8}, "tiny-budget", memory_budget={"host": 10_000, "device": None})
    err = _refused(shared_runtime, "session_create", payload)
    assert "of its 0.01 MiB budget" in str(err)
    sid, _ = _create(shared_runtime, {"data": 8})  # the local default admits the same session
    shared_runtime.call("session_delete", {"id": sid})
