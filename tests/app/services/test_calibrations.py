"""Calibration profiles in the service (app.services.calibrations): a request's
``calibration`` resolved (published ids as they are, stored profiles read back), and the
list and reads over both. The jobs fit is driven over HTTP in
tests/app/api/routes/test_calibrations.py."""

from __future__ import annotations

import anyio
import orjson
import pytest

from app.core.errors import ServiceError
from app.services import calibrations
from app.storage import calibrations as stored
from app.storage.db import Store
from datarax.estimate.calibrations import CalibrationProfile, get_profile, published_profiles
from datarax.estimate.serving_profiles import serving_profiles


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "cal.sqlite")
    s.open()
    yield s
    s.close()


def test_requests_name_published_or_stored_profiles(store):
    body = {**get_profile("published-tpu-jax").to_json(), "id": "jobs-1", "kind": "jobs"}
    anyio.run(stored.insert_profile, store, "jobs-1", body["created_at"], "jobs", "tpu", None,
              orjson.dumps(body).decode())  # fmt: skip
    assert anyio.run(calibrations.resolve, store, None) is None
    assert anyio.run(calibrations.resolve, store, "published-gpu-jax") == "published-gpu-jax"
    found = anyio.run(calibrations.resolve, store, "jobs-1")
    assert isinstance(found, CalibrationProfile) and found.id == "jobs-1"
    with pytest.raises(ServiceError) as err:
        anyio.run(calibrations.resolve, store, "jobs-2")
    assert err.value.code == "unknown_calibration"
    # Issue 58, class 11: the detail names the stored profiles too, and the nearest one.
    assert "did you mean 'jobs-1'" in err.value.detail and "['jobs-1']" in err.value.detail
    listed = orjson.loads(anyio.run(calibrations.list_profiles, store))["items"]
    shipped = len(published_profiles()) + len(serving_profiles())  # training and serving
    assert [p["id"] for p in listed][-1] == "jobs-1" and len(listed) == shipped + 1
    assert listed[0] == get_profile(listed[0]["id"]).to_json()
    assert orjson.loads(anyio.run(calibrations.read_profile, store, "jobs-1")) == body
    with pytest.raises(ServiceError) as err:
        anyio.run(calibrations.read_profile, store, "jobs-2")
    assert err.value.code == "calibration_not_found"
    assert "did you mean 'jobs-1'" in err.value.detail
