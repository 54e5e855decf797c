"""A store on a fresh file for each test of the jobs services."""

from __future__ import annotations

import pytest

from app.storage.db import Store


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "jobs.sqlite")
    s.open()
    yield s
    s.close()
