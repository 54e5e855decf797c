"""datarax.distributed.device_mesh: DeviceMeshManager on 8 simulated devices."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from datarax.distributed import DeviceMeshManager, PlanError
from tests.conftest import require_devices


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


def test_explicit_devices_are_used_in_order():
    devices = jax.devices()[::-1][:4]
    mesh = DeviceMeshManager.create_device_mesh({"data": 2, "model": 2}, devices)
    assert [d.id for d in mesh.devices.flat] == [d.id for d in devices]


@pytest.mark.parametrize(
    "make",
    [
        lambda: DeviceMeshManager.create_hybrid_mesh(data_parallel_size=4, model_parallel_size=4),
        lambda: DeviceMeshManager.create_model_parallel_mesh(num_devices=16),
        lambda: DeviceMeshManager.create_data_parallel_mesh(num_devices=16),
        lambda: DeviceMeshManager.create_device_mesh({"data": 16}, jax.devices()),
    ],
    ids=["hybrid", "model", "data", "device-mesh"],
)
def test_too_many_devices_names_both_numbers_in_upstreams_words(make):
    with pytest.raises(ValueError, match=r"^Not enough devices") as err:
        make()
    assert isinstance(err.value, PlanError) and err.value.code == "not_enough_devices"
    assert "16 devices" in str(err.value) and "only 8 are available" in str(err.value)


def test_explicit_axis_types_on_request():
    explicit = jax.sharding.AxisType.Explicit
    mesh = DeviceMeshManager.create_device_mesh({"data": 8}, axis_types=(explicit,))
    assert mesh.axis_types == (explicit,)
    with pytest.raises(ValueError, match="axis_types has 2 entries for 1 axes"):
        DeviceMeshManager.create_device_mesh({"data": 8}, axis_types=(explicit, explicit))
