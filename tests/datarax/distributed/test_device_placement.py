"""datarax.distributed.device_placement: placement, batch-size recommendations and the
background prefetcher (overlap and order shown with events, not timings)."""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from datarax.distributed import (
    BatchSizeRecommendation,
    DeviceMeshManager,
    DevicePlacement,
    HardwareType,
    distribute_batch,
    get_batch_size_recommendation,
    place_on_device,
    prefetch_to_device,
)
from tests.conftest import require_devices
from tests.datarax.support import placed_blocks

WAIT_S = 30  # liveness bound for background threads, never a timing assertion


@pytest.fixture(autouse=True)
def _eight():
    require_devices(8)


def test_place_on_device_and_passthrough():
    device = jax.devices()[3]
    out = place_on_device({"x": np.ones((4, 2), np.float32), "n": 3, "tag": "a"}, device)
    assert out["x"].devices() == {device} and out["n"].devices() == {device}
    assert out["tag"] == "a"
    assert place_on_device(np.zeros(2)).devices() == {jax.devices()[0]}


def test_distribute_batch_places_each_block():
    mesh = DeviceMeshManager.create_data_parallel_mesh()
    sharding = NamedSharding(mesh, P("data", None))
    x = np.arange(32, dtype=np.float32).reshape(16, 2)
    out = distribute_batch({"x": x, "meta": None}, sharding)
    assert out["x"].sharding.is_equivalent_to(sharding, 2) and out["meta"] is None
    assert placed_blocks(out["x"]) == {
        d.id: ((2 * i, 2 * i + 2), (0, 2)) for i, d in enumerate(mesh.devices.flat)
    }
    with pytest.raises(TypeError, match="Sharding, got str"):
        distribute_batch(x, "data")


def test_device_placement_class_methods():
    placement = DevicePlacement()
    assert placement.default_device == jax.devices()[0]
    assert placement.hardware_type is HardwareType.CPU
    assert placement.num_devices == 8
    mesh = DeviceMeshManager.create_data_parallel_mesh()
    sharded = placement.shard_batch_dim({"x": np.zeros((8, 3)), "s": np.float32(1)}, mesh)
    assert sharded["x"].sharding.is_equivalent_to(NamedSharding(mesh, P("data", None)), 2)
    replicated = placement.replicate_across_devices({"w": np.ones(3)})
    assert replicated["w"].sharding.is_fully_replicated
    assert len(replicated["w"].sharding.device_set) == 8
    info = placement.get_device_info()
    assert info["num_devices"] == 8 and info["hardware_type"] == "cpu"
    ok, message = placement.validate_batch_size(0)
    assert not ok and "below the minimum 1" in message
    assert placement.validate_batch_size(64) == (True, "Batch size 64 is optimal for cpu.")
    with pytest.raises(TypeError, match="jax.Device, got str"):
        DevicePlacement("gpu:0")
    with pytest.raises(ValueError, match="'model'"):
        placement.shard_batch_dim({"x": np.zeros(8)}, mesh, mesh_axis="model")


@pytest.mark.parametrize(
    ("hardware", "critical", "optimal"),
    [
        # Upstream datarax's values where the datasheet ratio differs only by rounding:
        (HardwareType.TPU_V5E, 240, 256),  # 197e12 / 819e9 = 240.5 (scaling book: 240)
        (HardwareType.H100, 298, 320),  # 989.5e12 / 3.35e12 = 295.4
        (HardwareType.H200, 207, 256),
        (HardwareType.A100, 154, 192),
    ],
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_batch_size_recommendation_from_datasheets(hardware, critical, optimal):
    rec = get_batch_size_recommendation(hardware)
    assert isinstance(rec, BatchSizeRecommendation)
    assert rec.critical_batch_size == critical and rec.optimal_batch_size == optimal
    assert rec.min_batch_size == critical // 4 and "https://" in rec.notes


def test_batch_size_notes_keep_the_datasheet_derivation():
    assert (
        "= 295.4; 298 as upstream datarax" in get_batch_size_recommendation(HardwareType.H100).notes
    )
    assert (
        "= 240.5; 240 as upstream datarax"
        in get_batch_size_recommendation(HardwareType.TPU_V5E).notes
    )
    assert "as upstream" not in get_batch_size_recommendation(HardwareType.H200).notes


def test_construction_is_lazy_and_first_use_resolves(monkeypatch):
    import datarax.distributed.device_placement as module

    calls = []
    real = module.jax.devices
    monkeypatch.setattr(module.jax, "devices", lambda *a: calls.append(a) or real(*a))
    placement = DevicePlacement(None)
    assert calls == [] and placement._default_device is None
    assert placement._hardware_type_cache is None
    assert placement.hardware_type is HardwareType.CPU  # resolves the device, once
    assert len(calls) == 1 and placement.default_device is real()[0]
    assert placement._hardware_type_cache is HardwareType.CPU and len(calls) == 1


def test_batch_size_recommendation_detects_cpu_and_rejects_strings():
    assert get_batch_size_recommendation() == get_batch_size_recommendation(HardwareType.CPU)
    with pytest.raises(TypeError, match="HardwareType"):
        get_batch_size_recommendation("h100")


# ------------------------------------------------------------------------- prefetch


class _Source:
    """Batches 0..n-1, produced on demand (a plain generator: overlap is shown by the
    prefetcher's own ``placed``/``pulled`` counters, not by the source)."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        for k in range(self.n):
            yield {"x": np.full((4, 2), k, np.float32), "k": k}


def _wait_until(condition) -> bool:
    event = threading.Event()
    for _ in range(WAIT_S * 100):
        if condition():
            return True
        event.wait(0.01)
    return condition()


def test_prefetch_places_the_next_item_while_the_current_one_is_in_use():
    device = jax.devices()[1]
    it = prefetch_to_device(_Source(6), size=2, device=device, cpu_buffer_size=1)
    first = next(it)
    assert first["x"].devices() == {device} and int(first["x"][0, 0]) == 0
    # While the caller still holds item 0, items 1 and 2 get copied to the device in the
    # background: the overlap prefetching exists for.
    assert _wait_until(lambda: it.placed >= 3), f"placed {it.placed} while item 0 was in use"
    ks = [first["k"]] + [item["k"] for item in it]
    assert ks == list(range(6))  # order kept, nothing lost or repeated
    assert it.placed == 6 and it.pulled == 6
    with pytest.raises(StopIteration):
        next(it)


def test_prefetch_is_bounded():
    size, cpu = 2, 3
    it = prefetch_to_device(_Source(1000), size=size, cpu_buffer_size=cpu)
    bound = size + cpu + 2  # each queue full, plus one item in each thread's hands
    assert _wait_until(lambda: it.pulled >= bound)
    threading.Event().wait(0.2)  # an unbounded reader would race far past the bound here
    assert it.pulled == bound and it.placed == size + 1
    assert [next(it)["k"] for _ in range(3)] == [0, 1, 2]
    it.close()
    assert list(it) == []


def test_prefetch_onto_a_sharding_and_error_order():
    mesh = DeviceMeshManager.create_data_parallel_mesh()

    def failing():
        yield {"x": np.zeros((8, 1))}
        raise RuntimeError("source broke at item 1")

    with prefetch_to_device(failing(), device=NamedSharding(mesh, P("data"))) as it:
        item = next(it)
        assert item["x"].sharding.is_equivalent_to(NamedSharding(mesh, P("data")), 2)
        with pytest.raises(RuntimeError, match="item 1"):
            next(it)


def test_prefetch_rejects_bad_sizes():
    with pytest.raises(ValueError, match="size must be an int >= 1, got 0"):
        prefetch_to_device(iter([]), size=0)
    with pytest.raises(ValueError, match="cpu_buffer_size"):
        prefetch_to_device(iter([]), cpu_buffer_size=-1)
