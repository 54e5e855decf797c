"""The database URL (app/core/database_url.py): which locations name PostgreSQL, the
password hidden, and the settings that validate and name the store with them."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from app.core.database_url import is_postgres_url, redact
from app.core.settings import Settings


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("postgresql://u@h/db", True),
        ("postgres://u@h/db", True),
        ("PostgreSQL://u@h/db", True),
        ("postgres:u@h/db", False),
        ("sqlite:///x.db", False),
        ("./var/datarax.sqlite", False),
        (Path("postgresql://u@h/db"), False),  # a path is a SQLite file, whatever its name
    ],
    ids=["postgresql", "postgres", "any-case", "no-slashes", "sqlite-url", "file", "path"],
)
def test_is_postgres_url(location, expected):
    assert is_postgres_url(location) is expected


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://user:s3cret@db:5432/x", "postgresql://user:***@db:5432/x"),
        ("postgresql://user@db/x", "postgresql://user@db/x"),
        ("postgresql://db/x", "postgresql://db/x"),
    ],
    ids=["password", "user-only", "no-user"],
)
def test_redact_hides_only_the_password(url, shown):
    assert redact(url) == shown


def test_settings_name_the_store_without_its_password(monkeypatch):
    monkeypatch.delenv("DATARAX_DATABASE_URL", raising=False)
    settings = Settings(database_url="postgresql://user:s3cret@db/x")
    assert settings.store_location == "postgresql://user:s3cret@db/x"
    assert settings.store_name == "postgresql://user:***@db/x"


@pytest.mark.parametrize("url", ["mysql://u@h/db", "postgres:u@h/db", "var/x.sqlite"])
def test_settings_refuse_a_database_url_that_is_not_postgres(monkeypatch, url):
    monkeypatch.delenv("DATARAX_DATABASE_URL", raising=False)
    with pytest.raises(ValidationError, match="expected a postgresql:// URL"):
        Settings(database_url=url)
