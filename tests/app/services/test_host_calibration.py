"""Host calibrations in the service (app.services.host_calibration): which catalog entry
the runtime's devices are, the default a plan takes from the newest finished host
profile of its devices, and a profile a stopped process left running. The measuring
itself runs over HTTP on the real runtime in tests/app/api/routes/test_calibrations.py."""

from __future__ import annotations

import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import anyio
import httpx
import orjson
import pytest

from app.core.errors import ServiceError
from app.services import calibrations
from app.services.host_calibration import HostCalibrations, catalog_entry
from app.storage import calibrations as stored
from app.storage import owners
from app.storage.db import Store
from datarax.estimate.calibrations import CalibrationProfile, get_profile
from tests.helpers import ServiceProcess, assert_problem


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "host.sqlite")
    s.open()
    yield s
    s.close()


def test_the_devices_are_the_catalog_entry_of_their_kind():
    assert catalog_entry("cpu", "cpu", None).name == "cpu"
    assert catalog_entry("NVIDIA H200", "gpu", None).name == "h200-sxm"
    assert catalog_entry("TPU v5 lite", "tpu", "tpu-v5e").name == "tpu-v5e"
    with pytest.raises(ServiceError) as unknown:
        catalog_entry("NVIDIA RTX 4090", "gpu", None)
    assert unknown.value.code == "invalid_calibration" and "hardware" in unknown.value.detail
    with pytest.raises(ServiceError) as wrong:
        catalog_entry("TPU v5 lite", "tpu", "tpu-v6e")
    assert wrong.value.code == "invalid_calibration"


def _host(store, profile_id, created_at, status, device_kind="cpu"):
    body = {**get_profile("published-cpu-jax").to_json(), "id": profile_id, "kind": "host",
            "status": status, "created_at": created_at, "device_kind": device_kind}  # fmt: skip
    anyio.run(stored.insert_profile, store, profile_id, created_at, "host", "cpu", device_kind,
              orjson.dumps(body).decode())  # fmt: skip


def test_a_plan_takes_the_newest_finished_host_profile_of_its_devices(store):
    assert anyio.run(calibrations.resolve, store, None, "cpu") is None
    _host(store, "host-old", "2026-12-01T00:00:00Z", "done")
    _host(store, "host-new", "2026-12-02T00:00:00Z", "done")
    _host(store, "host-failed", "2026-12-03T00:00:00Z", "failed")
    found = anyio.run(calibrations.resolve, store, None, "cpu")
    assert isinstance(found, CalibrationProfile) and found.id == "host-new"
    assert anyio.run(calibrations.resolve, store, None, "tpu-v5p") is None  # another kind
    with pytest.raises(ServiceError) as failed:
        anyio.run(calibrations.resolve, store, "host-failed")
    assert failed.value.code == "invalid_calibration" and "again" in failed.value.detail


def test_a_profile_left_running_is_marked_failed_at_the_next_start(store, monkeypatch):
    with monkeypatch.context() as previous:  # stored by a process that has stopped
        previous.setattr(owners, "OWNER", 777)
        _host(store, "host-cut", "2026-12-01T00:00:00Z", "running")
    _host(store, "host-mine", "2026-12-01T00:00:01Z", "running")  # this process measures it
    anyio.run(HostCalibrations(store, runtime=None).recover)  # type: ignore[arg-type]
    body = orjson.loads(anyio.run(stored.get_profile, store, "host-cut"))
    assert body["status"] == "failed" and "stopped" in body["problem"]["detail"]
    assert orjson.loads(anyio.run(stored.get_profile, store, "host-mine"))["status"] == "running"
    assert anyio.run(stored.running_profiles, store) == []


def test_concurrent_host_calibrations_start_one_and_a_sigterm_ends_it(tmp_path):
    # issue 58, class 7: four POSTs at once against the real server: exactly one 202, the
    # others 409 naming it (they store nothing); it cannot be deleted while it measures;
    # SIGTERM's stop() cancels and awaits it, so it is stored failed, not left running
    db = tmp_path / "race.sqlite"
    with ServiceProcess(db, tmp_path / "server.log") as server:
        server.wait_ready()
        barrier = threading.Barrier(4)

        def post(_: int) -> httpx.Response:
            with server.client() as client:
                barrier.wait(timeout=30)
                return client.post("/v1/calibrations", json={"kind": "host", "quick": False})

        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(post, range(4)))
        started = [a for a in answers if a.status_code == 202]
        assert len(started) == 1, [(a.status_code, a.text) for a in answers]
        running = started[0].json()["id"]
        for answer in answers:
            if answer is not started[0]:
                refused = assert_problem(answer, 409, "calibration_running")
                assert running in refused["detail"]
        with server.client() as client:
            kept = assert_problem(client.delete(f"/v1/calibrations/{running}"), 409,
                                  "calibration_running")  # fmt: skip
            assert "done or failed" in kept["detail"]
            listed = client.get("/v1/calibrations").json()["items"]
            assert [p["id"] for p in listed if p["kind"] == "host"] == [running]
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(timeout=120)
    store = Store(db)
    store.open()
    try:
        texts = anyio.run(stored.list_profiles, store)
    finally:
        store.close()
    assert [orjson.loads(t)["id"] for t in texts] == [running]
    body = orjson.loads(texts[0])
    assert body["status"] == "failed" and body["problem"]["code"] == "shutting_down", body
