"""Device commands in a real runtime (``devices``, ``ping``, ``mesh_grid``) and the memory
budgets they report."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from app.core.errors import ServiceError
from app.runtime.devices import host_capacity_bytes, memory_budgets
from app.workers.runtime_client import RuntimeClient
from tests.conftest import require_devices
from tests.helpers import make_settings


def test_ready_and_devices(shared_runtime):
    async def body(client: RuntimeClient) -> None:
        info = client.device_info()
        assert info is not None and client.ready
        assert info["platform"] == "cpu"
        assert (info["process_count"], info["process_index"]) == (1, 0)
        assert [d["id"] for d in info["devices"]] == list(range(8))
        assert {(d["platform"], d["process_index"]) for d in info["devices"]} == {("cpu", 0)}
        assert all(d["coords"] is None or isinstance(d["coords"], list) for d in info["devices"])
        budget = client.memory_budget()
        assert budget == info["memory_budget"] and budget["device"] is None
        assert 0 < budget["host"] <= host_capacity_bytes()
        fresh, arrays = await client.call("devices")
        assert fresh == info and arrays == {}
        ping, _ = await client.call("ping")
        assert ping["pid"] == client.pid != os.getpid()
        assert ping["uptime_s"] > 0

    shared_runtime.body(body)


MESHES = [
    ({"data": 2, "model": 4}, [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ({"data": 8}, [0, 1, 2, 3, 4, 5, 6, 7]),
    ({"model": 4}, [0, 1, 2, 3]),
    ({"data": -1, "model": 2}, [[0, 1], [2, 3], [4, 5], [6, 7]]),
    ({"data": 2, "fsdp": 2, "model": 2}, [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]),
]


def test_mesh_grid_matches_jax_mesh_order(shared_runtime):
    require_devices(8)

    async def body(client: RuntimeClient) -> None:
        for axes, expected in MESHES:
            result, _ = await client.call("mesh_grid", {"axes": axes})
            assert result["device_grid"] == expected, axes
            sizes = list(result["axes"].values())
            assert list(result["axes"]) == list(axes) and -1 not in sizes
            n = int(np.prod(sizes))
            mesh = jax.make_mesh(sizes, list(axes), devices=jax.devices()[:n])
            ids = np.vectorize(lambda d: d.id)(mesh.devices).tolist()
            assert result["device_grid"] == ids, axes
            assert result["process_index"] == {str(i): 0 for i in range(n)}
            assert result["platform"] == "cpu"

    shared_runtime.body(body)


@pytest.mark.parametrize(
    ("payload", "status", "code"),
    [
        ({"axes": {"data": 16}}, 422, "not_enough_devices"),
        ({"axes": {"data": -1, "model": -1}}, 422, "multiple_auto_axes"),
        ({"axes": []}, 422, "invalid_request"),
        ({}, 422, "invalid_request"),
    ],
    ids=["not_enough_devices", "multiple_auto_axes", "axes_not_object", "axes_missing"],
)
def test_mesh_grid_errors(shared_runtime, payload, status, code):
    async def body(client: RuntimeClient) -> None:
        with pytest.raises(ServiceError) as info:
            await client.call("mesh_grid", payload)
        assert (info.value.status, info.value.code) == (status, code)
        assert info.value.title and info.value.detail
        if code == "not_enough_devices":
            assert "16" in info.value.detail and "8" in info.value.detail
        assert (await client.call("ping"))[0]["pid"] == client.pid  # still serving

    shared_runtime.body(body)


def test_memory_budgets(tmp_path):
    fixed = memory_budgets(make_settings(tmp_path, memory_budget_mb=3))
    assert fixed == {"host": 3 * 2**20, "device": 3 * 2**20}
    half = memory_budgets(make_settings(tmp_path, memory_fraction=0.5))
    assert half["device"] is None  # CPU devices only: the host's memory is the pool
    assert half["host"] == int(host_capacity_bytes() * 0.5)
    assert host_capacity_bytes() <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
