"""Issue 27: a quiet, independent start. Two ``datarax-serve`` on one CPU host, started
as a user's shell would (no ``JAX_PLATFORMS``, ``DATARAX_PLATFORMS``,
``ALLOW_MULTIPLE_LIBTPU_LOAD`` or ``TPU_SKIP_MDS_QUERY``; libtpu installed), both serve
and both run TPU compile checks to ``done``, while a third libtpu user, a plain process
that takes libtpu's host-wide lock (``/tmp/libtpu_lockfile``) to describe a TPU topology
ahead of time, holds it.

What makes it work (measured with jax 0.12.0.1 and libtpu 0.0.50.1): the runtime is
started with ``JAX_PLATFORMS=cpu`` by the service itself (detected: no accelerator), so
it never loads libtpu; the compile worker loads libtpu with
``ALLOW_MULTIPLE_LIBTPU_LOAD=1``, under which libtpu neither takes the lock nor is refused
by its holder. Without the first, the third process failed with "Internal error when
accessing libtpu multi-process lockfile"; without the second, a worker beside it did.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.datarax.spmd.test_compile_step import _require_libtpu
from tests.helpers import PROJECT_ROOT, ServiceProcess

LIBTPU_ENV = (
    "JAX_PLATFORMS",
    "DATARAX_PLATFORMS",
    "ALLOW_MULTIPLE_LIBTPU_LOAD",
    "TPU_SKIP_MDS_QUERY",
    "XLA_FLAGS",
)
TPU_PLAN = {"hardware": "tpu-v5e", "topology": "2x2", "ici": {"data": 4}, "batch_shape": [64, 128]}
TINY = {"model": {"kind": "mlp", "features": [128, 256, 128]}}
THIRD_USER = """
import sys
from jax.experimental import topologies
topology = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2")
print("topology devices", len(topology.devices), flush=True)
sys.stdin.readline()  # holds libtpu (and its lock) until the test lets it go
"""
DEADLINE_S = 240.0


def _third_user() -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in LIBTPU_ENV}
    env["JAX_PLATFORMS"] = "cpu"  # an ahead-of-time user: CPU backend, TPU topology only
    return subprocess.Popen(
        [sys.executable, "-c", THIRD_USER],
        env=env,
        cwd=PROJECT_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _lock_holders() -> list[int]:
    """Processes with /tmp/libtpu_lockfile open (Linux /proc)."""
    holders = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{name}/fd/{fd}") == "/tmp/libtpu_lockfile":
                    holders.append(int(name))
                    break
            except OSError:
                continue
    return holders


@pytest.mark.slow
def test_two_services_and_a_third_libtpu_user_share_the_host(tmp_path):
    _require_libtpu()
    servers = [
        ServiceProcess(tmp_path / f"s{i}.sqlite", tmp_path / f"s{i}.log", unset=LIBTPU_ENV).start()
        for i in range(2)
    ]
    third = None
    try:
        ready = [server.wait_ready() for server in servers]
        runtimes = {body["runtime_pid"] for body in ready}
        assert len(runtimes) == 2, ready
        assert not runtimes & set(_lock_holders()), "a serving runtime holds libtpu's lock"

        # The third user starts after both runtimes are up, and takes libtpu's lock.
        third = _third_user()
        first = third.stdout.readline()
        assert first.strip() == "topology devices 4", (first, third.stderr.read())
        assert third.pid in _lock_holders()

        # While it holds the lock, both services compile TPU checks to the end.
        clients = [server.client(timeout=120) for server in servers]
        locations = []
        for client in clients:
            plan = client.post("/v1/meshes", json=TPU_PLAN)
            assert plan.status_code == 201, plan.text
            check = client.post(f"/v1/meshes/{plan.json()['id']}/compile-checks", json=TINY)
            assert check.status_code == 202, check.text
            locations.append(check.headers["location"])
        started = time.monotonic()
        for client, location in zip(clients, locations, strict=True):
            deadline = time.monotonic() + DEADLINE_S
            check = client.get(location).json()
            while check["status"] not in ("done", "failed", "cancelled"):
                assert time.monotonic() < deadline, check
                time.sleep(0.1)
                check = client.get(location).json()
            assert check["status"] == "done", check
            assert check["target"]["kind"] == "tpu" and check["result"]["fits"] is True, check
        print(f"both TPU checks done {time.monotonic() - started:.1f} s after submission")
        for client in clients:
            client.close()

        assert third.poll() is None, "the third libtpu user died meanwhile"
        third.stdin.write("\n")
        third.stdin.flush()
        assert third.wait(timeout=60) == 0, third.stderr.read()

        for server in servers:
            log = server.log_tail(200_000)
            assert "JAX_PLATFORMS=cpu" in log, log[-2000:]  # what the service chose
            for noise in ("INVALID_ARGUMENT", "libtpu_lockfile", "TPU initialization failed"):
                assert noise not in log, (noise, log[-3000:])
    finally:
        if third is not None and third.poll() is None:
            third.kill()
            third.wait(timeout=30)
        for server in servers:
            server.stop()
