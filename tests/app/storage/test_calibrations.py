"""The calibrations table (app.storage.calibrations): a profile stored once, read back by
id, listed newest first; an id is never written twice."""

from __future__ import annotations

import anyio
import pytest

from app.storage import calibrations
from app.storage.db import Store
from app.storage.errors import Conflict


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "cal.sqlite")
    s.open()
    yield s
    s.close()


def test_profiles_round_trip_newest_first(store):
    for i, stamp in enumerate(
        ("2026-12-06T00:00:01Z", "2026-12-06T00:00:03Z", "2026-12-06T00:00:02Z")
    ):
        anyio.run(calibrations.insert_profile, store, f"jobs-{i}", stamp, "jobs", "tpu", None,
                  f'{{"id": "jobs-{i}"}}')  # fmt: skip
    assert anyio.run(calibrations.get_profile, store, "jobs-1") == '{"id": "jobs-1"}'
    assert anyio.run(calibrations.get_profile, store, "nope") is None
    listed = anyio.run(calibrations.list_profiles, store)
    assert listed == ['{"id": "jobs-1"}', '{"id": "jobs-2"}', '{"id": "jobs-0"}']
    assert anyio.run(calibrations.list_profiles, store, 1) == ['{"id": "jobs-1"}']
    with pytest.raises(Conflict):
        anyio.run(calibrations.insert_profile, store, "jobs-0", "x", "jobs", "tpu", None, "{}")
