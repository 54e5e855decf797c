"""Service settings: ``DATARAX_*`` variables, bounds, the multi-host rule, derived sizes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.core.settings import Settings


@pytest.fixture(autouse=True)
def _no_datarax_environment(monkeypatch):
    for name in list(os.environ):
        if name.startswith("DATARAX_"):
            monkeypatch.delenv(name)


def test_defaults_bind_localhost_with_an_open_api():
    settings = Settings()
    assert (settings.host, settings.port) == ("127.0.0.1", 8000)
    assert settings.api_token is None and not settings.multihost


def test_environment_variables_use_the_prefix(monkeypatch, tmp_path):
    monkeypatch.setenv("DATARAX_PORT", "9001")
    monkeypatch.setenv("DATARAX_DB", str(tmp_path / "x.sqlite"))
    monkeypatch.setenv("DATARAX_API_TOKEN", "secret")
    settings = Settings()
    assert settings.port == 9001
    assert settings.data_dir == tmp_path
    assert settings.api_token is not None and settings.api_token.get_secret_value() == "secret"
    assert "secret" not in repr(settings)


def test_sizes_in_bytes():
    settings = Settings(max_body_mb=1.5, max_header_kb=8, max_answer_mb=2)
    assert settings.max_body_bytes == 1_572_864
    assert settings.max_header_bytes == 8192
    assert settings.max_answer_bytes == 2 * 1024 * 1024


@pytest.mark.parametrize(
    "values",
    [{"max_body_mb": 0}, {"cpu_devices": 0}, {"max_headers": 7}, {"shutdown_grace_s": -1}],
    ids=["body", "devices", "headers", "grace"],
)
def test_out_of_bounds_values_are_refused(values):
    with pytest.raises(ValidationError):
        Settings(**values)


def test_multihost_needs_all_three_or_distributed_detection():
    with pytest.raises(ValidationError, match="coordinator, num_processes and process_id"):
        Settings(coordinator="10.0.0.1:1234")
    with pytest.raises(ValidationError, match="must be below num_processes"):
        Settings(coordinator="10.0.0.1:1234", num_processes=2, process_id=2)
    explicit = Settings(coordinator="10.0.0.1:1234", num_processes=2, process_id=1)
    assert explicit.multihost
    assert Settings(distributed=True).multihost


def test_data_dir_is_beside_the_database():
    assert Settings(db=Path("/srv/d/db.sqlite")).data_dir == Path("/srv/d")
