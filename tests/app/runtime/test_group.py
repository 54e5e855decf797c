"""Multi-host fan-out: the protocol in this process, then one service across two real JAX
processes of 4 CPU devices each.

Process 0's runtime is driven through :class:`app.workers.runtime_client.RuntimeClient`, as the
HTTP process does; process 1 is a real follower host (``datarax-serve`` with process id 1,
run as ``python -m app.cli``) in its own process group. They form one JAX distributed
runtime over 127.0.0.1 (gloo collectives), with the heartbeat timeout lowered to
:data:`HEARTBEAT_S`. Every spawned process is bounded by timeouts and killed by process
group, its runtime included.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from jax.errors import JaxRuntimeError

from app.core import channel
from app.core.errors import ServiceError, WorkerLost
from app.core.settings import Settings
from app.runtime import group as groups
from app.runtime.group import CommandGroup
from tests.helpers import PROJECT_ROOT, free_port
from tests.runtime_support import READY_S, RuntimeHandle, pid_gone

HEARTBEAT_S = 4.0
LOST_MARGIN_S = 3.0
"""Readiness must drop within HEARTBEAT_S (measured: 2.5 to 4.2 s); slack for a busy box."""
DEVICES_PER_PROCESS = 4
FEATURES = [16, 64, 64, 8]
STEPS = 3
BATCH = 32


# ------------------------------------------------------------------ without processes


@pytest.mark.parametrize(
    ("heartbeat_s", "jax_s"), [(10, 9), (30, 29), (4.5, 4), (1.5, 1), (0.5, 1)]
)
def test_jax_heartbeat_leaves_headroom_below_the_setting(heartbeat_s, jax_s):
    assert groups.jax_heartbeat_timeout_s(heartbeat_s) == jax_s


def test_process_id_of():
    assert groups.process_id_of(Settings()) is None
    assert groups.process_id_of(Settings(distributed=True, process_id=3)) == 3
    settings = Settings(coordinator="h:1", num_processes=2, process_id=1)
    assert groups.process_id_of(settings) == 1


def test_command_frame_round_trip():
    arrays = {"inputs": np.arange(12, dtype=np.float32).reshape(3, 4), "k": np.int64(5)}
    raw = b"".join(channel.encode_message({"command": "x", "payload": {"a": 1}}, arrays))
    header, decoded = groups.decode_frame(raw)
    assert header["command"] == "x" and header["payload"] == {"a": 1}
    np.testing.assert_array_equal(decoded["inputs"], arrays["inputs"])
    assert decoded["k"].shape == () and decoded["k"] == 5
    for cut in (raw[:-1], raw[:2], raw[:10]):
        with pytest.raises(channel.ChannelError):
            groups.decode_frame(cut)
    spec = {"name": "x", "dtype": "object", "shape": [1], "nbytes": 1}
    head = json.dumps({"command": "x", "arrays": [spec]}).encode()
    header, error = groups.decode_frame(struct.pack(">I", len(head)) + head + b"\0")
    assert header["command"] == "x"
    assert isinstance(error, channel.ArrayError) and error.code == "unsupported_dtype"


def test_outcomes():
    assert groups.outcome_of({"ok": True}) == "ok"
    assert groups.outcome_of({"ok": False, "error": {"code": "x_y"}}) == "error:x_y"
    assert groups.outcome_of({"ok": False}) == "error:runtime_error"


class MemoryKeyValue:
    """JAX's coordination-service key-value client, in memory (same calls, same errors)."""

    def __init__(self) -> None:
        self.store: dict[str, Any] = {}
        self.down = False

    def _get(self, key: str) -> Any:
        if self.down:
            raise JaxRuntimeError("UNAVAILABLE: the coordination service is gone")
        if key not in self.store:
            raise JaxRuntimeError(f"DEADLINE_EXCEEDED: {key}")
        return self.store[key]

    def key_value_set(self, key: str, value: str) -> None:
        self.store[key] = value

    key_value_set_bytes = key_value_set

    def blocking_key_value_get(self, key: str, timeout_ms: int) -> str:  # noqa: ARG002
        return self._get(key)

    def blocking_key_value_get_bytes(self, key: str, timeout_ms: int) -> bytes:  # noqa: ARG002
        return self._get(key)

    def key_value_delete(self, key: str) -> None:
        for name in [k for k in self.store if k == key or k.startswith(key + "/")]:
            del self.store[name]


def _pair(followers: int = 1) -> tuple[MemoryKeyValue, CommandGroup, list[CommandGroup]]:
    kv = MemoryKeyValue()
    leader = CommandGroup(kv, 0, followers + 1, "e1", ack_timeout_s=0.1)
    others = [CommandGroup(kv, i, followers + 1, "e1", 0.1) for i in range(1, followers + 1)]
    return kv, leader, others


def test_commands_reach_followers_in_order_and_acks_are_compared():
    kv, leader, (follower,) = _pair()
    assert leader.is_leader and not follower.is_leader
    assert follower.next_command(1) is None  # nothing published yet
    seqs = [
        leader.publish({"command": "c", "payload": {"n": n}}, {"x": np.full(2, n)})
        for n in range(2)
    ]
    assert seqs == [0, 1]
    for n in range(2):
        header, arrays = groups.decode_frame(follower.next_command(1))
        assert header["payload"] == {"n": n} and arrays["x"].tolist() == [n, n]
        follower.ack("ok" if n == 0 else "error:invalid_request")
    assert leader.collect_acks(0, "ok") == []
    problems = leader.collect_acks(1, "ok")
    assert problems == ["process 1 answered 'error:invalid_request' where process 0 had 'ok'"]
    assert not kv.store  # commands and acks deleted
    seq = leader.publish({"command": "c"}, {})
    (problem,) = leader.collect_acks(seq, "ok")  # nobody acked within the timeout
    assert problem.startswith("process 1 did not finish command 2")


def test_a_follower_runs_the_leaders_commands_and_refuses_its_parents():
    kv, leader, (follower,) = _pair()
    ran: list[str] = []

    def execute(header: dict, arrays: Any) -> tuple[dict, dict]:  # noqa: ARG001
        ran.append(header["command"])
        ok = header["command"] != "fails"
        reply = {"id": header.get("id"), "ok": ok}
        return (reply if ok else {**reply, "error": {"code": "invalid_request"}}), {}

    leader.publish({"command": "everywhere"}, {})
    leader.publish({"command": "fails"}, {})
    corrupt = leader.seq
    leader.seq += 1
    kv.key_value_set_bytes(leader._key("cmd", corrupt), b"\0\0\0\5nope!")
    parent, child = socket.socketpair()
    parent.settimeout(10)
    try:
        channel.send_message(parent, channel.encode_message({"id": 1, "command": "mesh_grid"}))
        channel.send_message(parent, channel.encode_message({"id": 2, "command": "devices"}))
        # The follower answers its parent, runs every published command, then the
        # coordination service goes away: exit status 1.
        original = follower.next_command

        def next_command(timeout_ms: int) -> bytes | None:
            if follower.seq == 3:
                kv.down = True
            return original(timeout_ms)

        follower.next_command = next_command
        status = groups.follow(child, follower, execute, {"devices"})
        assert status == 1
        refused, _ = channel.recv_message(parent)
        assert refused["id"] == 1 and refused["error"]["code"] == "not_leader"
        assert refused["error"]["status"] == 409 and "'mesh_grid'" in refused["error"]["detail"]
        answered, _ = channel.recv_message(parent)
        assert answered == {"id": 2, "ok": True, "arrays": []}
    finally:
        parent.close()
        child.close()
    assert [c for c in ran if c != "devices"] == ["everywhere", "fails"]  # in order
    assert ran.count("devices") == 1  # the parent's local command, run once
    kv.down = False
    acks = [kv.store[follower._key("ack", seq, 1)] for seq in range(3)]
    assert acks == ["ok", "error:invalid_request", "error:corrupt_command"]


def _never_called(header: dict, arrays: Any) -> tuple[dict, dict]:  # noqa: ARG001
    raise AssertionError(f"nothing should run, got {header!r}")


def test_a_follower_ends_when_its_parent_closes_the_channel():
    _, _, (follower,) = _pair()
    parent, child = socket.socketpair()
    parent.close()
    try:
        assert groups.follow(child, follower, _never_called, ()) == 0
    finally:
        child.close()


# ----------------------------------------------------------------------- real processes


def _group_settings(tmp: Path, port: int, process_id: int) -> dict[str, Any]:
    return {
        "coordinator": f"127.0.0.1:{port}",
        "num_processes": 2,
        "process_id": process_id,
        "cpu_devices": DEVICES_PER_PROCESS,
        "platforms": "cpu",
        "heartbeat_s": HEARTBEAT_S,
        "distributed_init_timeout_s": 60.0,
        "runtime_start_timeout_s": READY_S,
        "step_timeout_s": 120.0,
        "db": tmp / f"p{process_id}" / "datarax.sqlite",
    }


def _env_of(values: dict[str, Any]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATARAX_")}
    env.update({f"DATARAX_{k.upper()}": str(v) for k, v in values.items()})
    env["PYTHONPATH"] = str(PROJECT_ROOT)
    env["JAX_PLATFORMS"] = "cpu"
    return env


class Follower:
    """``datarax-serve`` of process 1 (``python -m app.cli``, settings from ``DATARAX_*``)
    in its own process group: a follower host."""

    def __init__(self, values: dict[str, Any], log_path: Path):
        self.env = _env_of(values)
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> Follower:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "app.cli"],
                cwd=PROJECT_ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def runtime_pids(self) -> set[int]:
        text = self.log_tail(1 << 20)
        return {int(p) for p in re.findall(r"runtime process (\d+) started", text)}

    def kill(self) -> None:
        """SIGKILL to the follower's process group; its runtime (own session) goes too."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        for pid in self.runtime_pids():  # dies with its parent (PDEATHSIG); make sure
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""


@pytest.fixture(scope="module")
def reference(shared_runtime):
    """Losses of the same sessions in a single-process runtime with 8 devices."""
    return {name: _train(shared_runtime, axes, spec) for name, (axes, spec) in TRAINING.items()}


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    """A two-process group: ``(leader, follower)``; torn down by process group."""
    tmp = tmp_path_factory.mktemp("group")
    port = free_port()
    for pid in (0, 1):
        (tmp / f"p{pid}").mkdir()
    follower = Follower(_group_settings(tmp, port, 1), tmp / "follower.log").start()
    leader = RuntimeHandle(Settings(**_group_settings(tmp, port, 0)))
    try:
        assert leader.wait_ready(), f"group did not form; follower log:\n{follower.log_tail()}"
        yield leader, follower
    finally:
        leader.close()
        follower.kill()


TRAINING = {
    "data8": ({"data": 8}, {}),
    "data2-model4": ({"data": 2, "model": 4}, {"param_sharding": "model"}),
    "data8-collective": ({"data": 8}, {"strategy": "collective"}),
    "model8": ({"model": 8}, {"param_sharding": "model"}),  # batch replicated on both
    "data4-process0-only": ({"data": 4}, {}),  # process 1 owns no device of this mesh
}

_ids = iter(range(10_000))


def _create(leader: RuntimeHandle, axes: dict, spec: dict) -> tuple[str, dict]:
    grid, _ = leader.call("mesh_grid", {"axes": axes})
    payload = {
        "id": f"g{next(_ids)}",
        "mesh": {"axes": grid["axes"], "device_grid": grid["device_grid"]},
        "model": {"kind": "mlp", "features": FEATURES},
        "optimizer": {"name": "adam", "learning_rate": 0.01},
        "loss": "mse",
        "seed": 0,
        **spec,
    }
    created, _ = leader.call("session_create", payload)
    return payload["id"], created


def _client_batch() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    return {
        "inputs": rng.standard_normal((BATCH, FEATURES[0])).astype(np.float32),
        "targets": rng.standard_normal((BATCH, FEATURES[-1])).astype(np.float32),
    }


def _train(leader: RuntimeHandle, axes: dict, spec: dict) -> dict[str, list[float]]:
    """Synthetic steps, then steps on a batch the caller sends (shipped to every process)."""
    sid, created = _create(leader, axes, spec)
    if spec.get("param_sharding") == "model":  # kernels split over 'model', across hosts
        kernel = next(p for p in created["params"] if p["path"] == "layers/0/kernel")
        assert kernel["spec"] == [None, "model"]
        assert kernel["shard_shape"] == [FEATURES[0], FEATURES[1] // axes["model"]]
    synthetic, _ = leader.call(
        "session_step", {"id": sid, "steps": STEPS, "synthetic": {"seed": 3, "batch_size": BATCH}}
    )
    given, _ = leader.call("session_step", {"id": sid, "steps": 2}, _client_batch())
    assert given["step"] == STEPS + 2
    leader.call("session_delete", {"id": sid})
    return {"synthetic": synthetic["losses"], "given": given["losses"]}


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_devices_are_global(group):
    leader, _ = group
    info = leader.client.device_info()
    assert info is not None and info["process_count"] == 2 and info["process_index"] == 0
    devices = info["devices"]
    assert len(devices) == 2 * DEVICES_PER_PROCESS
    by_process = {0: [], 1: []}
    for device in devices:
        by_process[device["process_index"]].append(device["id"])
    assert [len(ids) for ids in by_process.values()] == [DEVICES_PER_PROCESS] * 2
    assert len({d["id"] for d in devices}) == len(devices)
    fresh, _ = leader.call("devices")
    assert fresh == info
    ping, _ = leader.call("ping")  # local: answered by process 0 alone
    assert ping["pid"] == leader.client.pid


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_the_coordinator_listens_on_its_own_address_only(group):
    """JAX's default is every interface (``[::]:port``); ours is the coordinator address."""
    leader, _ = group
    port = int(leader.client._settings.coordinator.rsplit(":", 1)[1])
    listening = [
        c.laddr
        for c in psutil.Process(leader.client.pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    ]
    assert listening, "the leader's runtime hosts no coordination service on the port"
    # gRPC listens on a v6 socket: 127.0.0.1 shows as ::ffff:127.0.0.1, every interface as ::
    bound = {ipaddress.ip_address(addr.ip) for addr in listening}
    assert {getattr(ip, "ipv4_mapped", None) or ip for ip in bound} == {
        ipaddress.ip_address("127.0.0.1")
    }, listening


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_live_meshes_span_processes(group):
    leader, _ = group
    flat, _ = leader.call("mesh_grid", {"axes": {"data": 8}})
    owners = [flat["process_index"][str(i)] for i in flat["device_grid"]]
    assert owners == [0] * 4 + [1] * 4
    hybrid, _ = leader.call("mesh_grid", {"axes": {"data": 2, "model": -1}})
    assert hybrid["axes"] == {"data": 2, "model": 4}
    rows = [[hybrid["process_index"][str(i)] for i in row] for row in hybrid["device_grid"]]
    assert rows == [[0] * 4, [1] * 4]  # one data row per process
    with pytest.raises(ServiceError) as err:  # refused alike on every process
        leader.call("mesh_grid", {"axes": {"data": 16}})
    assert err.value.code == "not_enough_devices"
    assert leader.call("mesh_grid", {"axes": {"data": 8}})[0] == flat  # group still in step


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("axes", "rows"),
    [({"data": 8}, [[0, 16]]), ({"data": 2, "model": 4}, [[0, 16]]), ({"model": 8}, [[0, 32]])],
    ids=["data8", "data2-model4", "model8-replicated"],
)
def test_each_process_places_only_its_rows(group, axes, rows):
    leader, _ = group
    grid, _ = leader.call("mesh_grid", {"axes": axes})
    mine, _ = leader.call("mh_local_rows", {**grid, "rows": 32})
    assert mine == {"process": 0, "rows": rows}


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("axes", "local_rows", "starts"),
    [({"data": 8}, 16, [0, 4, 8, 12]), ({"data": 2, "model": 4}, 16, [0]), ({"model": 8}, 32, [0])],
    ids=["data8", "data2-model4", "model8-replicated"],
)
def test_process_local_batches_become_global_arrays(group, axes, local_rows, starts):
    """place_batch_on_shards with each process's own rows builds the one global batch."""
    leader, _ = group
    grid, _ = leader.call("mesh_grid", {"axes": axes})
    got, _ = leader.call("mh_place_local", {**grid, "rows": 32})
    assert got["shape"] == [32, 3] and got["local_rows"] == local_rows
    assert got["sum"] == float(np.arange(96).sum())
    assert got["shard_starts"] == starts


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", list(TRAINING))
def test_training_across_processes_matches_one_process(group, reference, case):
    leader, _ = group
    axes, spec = TRAINING[case]
    got = _train(leader, axes, spec)
    for kind in ("synthetic", "given"):
        np.testing.assert_allclose(
            got[kind], reference[case][kind], rtol=2e-4, err_msg=f"{case} {kind}"
        )
    assert got["synthetic"][-1] < got["synthetic"][0]


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_refused_step_changes_nothing_on_any_process(group):
    leader, _ = group
    sid, _ = _create(leader, {"data": 8}, {})
    with pytest.raises(ServiceError) as err:
        leader.call(
            "session_step", {"id": sid, "steps": 1, "synthetic": {"seed": 0, "batch_size": 12}}
        )
    assert err.value.code == "batch_not_divisible"
    ok, _ = leader.call(
        "session_step", {"id": sid, "steps": 1, "synthetic": {"seed": 0, "batch_size": 16}}
    )
    assert ok["step"] == 1
    leader.call("session_delete", {"id": sid})


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_memory_refusals_agree_across_processes(group):
    # A mesh on process 0's devices only, with a budget that cannot hold the session:
    # process 1 holds none of its devices, yet must refuse it too. Had it admitted the
    # session, the outcomes would differ and the group restart (500 runtime_diverged).
    leader, _ = group
    pid = leader.client.pid
    budget = leader.client.memory_budget()
    assert budget is not None and budget["host"] > 0  # the leader's, sent with commands
    grid, _ = leader.call("mesh_grid", {"axes": {"data": 4}})
    assert set(grid["process_index"].values()) == {0}
    payload = {
        "id": "too-big",
        "mesh": {"axes": grid["axes"], "device_grid": grid["device_grid"]},
        "model": {"kind": "mlp", "features": FEATURES},
        "memory_budget": {"host": 1000, "device": None},
    }
    with pytest.raises(ServiceError) as err:
        leader.call("session_create", payload)
    assert err.value.status == 422 and err.value.code == "insufficient_memory"
    assert "process 0" in err.value.detail
    assert leader.client.ready and leader.client.pid == pid  # no restart
    with pytest.raises(ServiceError) as lost:  # on no process
        leader.call("session_info", {"id": "too-big"})
    assert lost.value.code == "session_lost"
    sid, _ = _create(leader, {"data": 4}, {})  # the leader's real budget admits it
    leader.call("session_delete", {"id": sid})


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_diverging_processes_restart_the_group(group):
    leader, _ = group
    old_pid = leader.client.pid
    with pytest.raises(ServiceError) as err:
        leader.call("mh_fail_on_followers")
    assert err.value.status == 500 and err.value.code == "runtime_diverged"
    assert "error:runtime_error" in err.value.detail
    leader.seconds_until_not_ready(10.0)  # the leader's runtime exits after answering
    assert not leader.client.ready, "the leader's runtime kept running after diverging"
    assert leader.wait_ready(), "group did not re-form after diverging"
    assert leader.client.pid != old_pid
    assert leader.call("mesh_grid", {"axes": {"data": 8}})[0]["axes"] == {"data": 8}


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_lost_follower_is_worker_lost_and_the_group_comes_back(group, reference):
    leader, follower = group
    sid, _ = _create(leader, {"data": 8}, {})
    old_pid = leader.client.pid

    follower.kill()
    lost_after = leader.seconds_until_not_ready(HEARTBEAT_S + LOST_MARGIN_S)
    assert not leader.client.ready, (
        f"leader still ready {lost_after:.1f} s after the follower died (heartbeat {HEARTBEAT_S} s)"
    )
    with pytest.raises(WorkerLost):
        leader.call("devices")
    print(f"readiness dropped {lost_after:.2f} s after kill -9 (heartbeat {HEARTBEAT_S} s)")

    restarted = time.monotonic()
    follower.start()
    assert leader.wait_ready(), f"group did not re-form:\n{follower.log_tail()}"
    print(f"group re-formed {time.monotonic() - restarted:.2f} s after the follower restarted")
    assert leader.client.pid != old_pid and leader.client.restarts >= 1
    assert leader.client.device_info()["process_count"] == 2
    with pytest.raises(ServiceError) as err:
        leader.call("session_info", {"id": sid})
    assert err.value.status == 410 and err.value.code == "session_lost"
    axes, spec = TRAINING["data8"]
    got = _train(leader, axes, spec)
    np.testing.assert_allclose(got["synthetic"], reference["data8"]["synthetic"], rtol=2e-4)


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_sigterm_stops_runtimes_and_followers(group):
    """The preemption notifier is off: SIGTERM ends a runtime (JAX would swallow it), and
    a follower host exits 0 on SIGTERM, taking its runtime with it."""
    leader, follower = group
    assert leader.wait_ready()
    runtime = max(follower.runtime_pids())
    os.kill(runtime, signal.SIGTERM)
    assert pid_gone(runtime, 5.0), "the follower's runtime ignored SIGTERM"
    follower.proc.send_signal(signal.SIGTERM)
    assert follower.proc.wait(timeout=20) == 0
    assert all(pid_gone(pid, 5.0) for pid in follower.runtime_pids())


# --------------------------------------------------------------------- through HTTP


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_datarax_serve_leader_end_to_end(tmp_path):
    from tests.helpers import ServiceProcess, assert_problem

    port = free_port()
    for pid in (0, 1):
        (tmp_path / f"p{pid}").mkdir()
    leader_values = _group_settings(tmp_path, port, 0)
    env = {
        f"DATARAX_{k.upper()}": str(v)
        for k, v in leader_values.items()
        if k not in ("db", "platforms")
    }
    follower = Follower(_group_settings(tmp_path, port, 1), tmp_path / "follower.log").start()
    try:
        with ServiceProcess(leader_values["db"], tmp_path / "leader.log", env=env) as service:
            service.wait_ready()
            with service.client() as client:
                devices = client.get("/v1/devices").json()
                assert devices["process_count"] == 2 and len(devices["devices"]) == 8
                assert {d["process_index"] for d in devices["devices"]} == {0, 1}
                live = client.post("/v1/meshes", json={"axes": {"data": 8}, "batch_shape": [16]})
                assert live.status_code == 201, live.text
                assert {s["process_index"] for s in live.json()["shards"]} == {0, 1}
                session = client.post(
                    f"/v1/meshes/{live.json()['id']}/sessions",
                    json={"model": {"kind": "mlp", "features": [4, 8, 2]}},
                )
                assert session.status_code == 201, session.text
                steps_url = f"/v1/sessions/{session.json()['id']}/steps"
                step_body = {"steps": 2, "synthetic": {"seed": 1, "batch_size": 16}}
                first = client.post(steps_url, json=step_body)
                assert first.status_code == 200 and first.json()["step"] == 2, first.text

                follower.kill()
                start = time.monotonic()
                while time.monotonic() - start < HEARTBEAT_S + LOST_MARGIN_S:
                    ready = client.get("/health/ready")
                    if ready.status_code == 503:
                        break
                    time.sleep(0.1)
                assert_problem(ready, 503, "worker_lost")
                print(f"/health/ready 503 {time.monotonic() - start:.2f} s after kill -9")
                assert_problem(client.get("/v1/devices"), 503, "worker_lost")
                assert_problem(client.post(steps_url, json=step_body), 503, "worker_lost")
                # Everything that needs no devices keeps working meanwhile.
                abstract = client.post("/v1/meshes", json={"axes": {"data": -1}, "num_devices": 8})
                assert abstract.status_code == 201, abstract.text
                reduced = client.post("/v1/metrics/reduce", json={"metrics": {"loss": [1, 3]}})
                assert reduced.status_code == 200 and reduced.json()["reduced"]["loss"] == 2.0
                assert client.get("/health/live").status_code == 200

                # The lost host comes back with its same command: the group re-forms.
                follower = Follower(
                    _group_settings(tmp_path, port, 1), tmp_path / "follower.log"
                ).start()
                service.wait_ready()
                assert len(client.get("/v1/devices").json()["devices"]) == 8
                assert_problem(client.post(steps_url, json=step_body), 410, "session_lost")
                again = client.post(
                    f"/v1/meshes/{live.json()['id']}/sessions",
                    json={"model": {"kind": "mlp", "features": [4, 8, 2]}},
                )
                assert again.status_code == 201, again.text
                after = client.post(f"/v1/sessions/{again.json()['id']}/steps", json=step_body)
                assert after.status_code == 200, after.text
                np.testing.assert_allclose(after.json()["losses"], first.json()["losses"])
    finally:
        follower.kill()
