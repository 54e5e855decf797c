"""The database URL (app/core/database_url.py): which locations name PostgreSQL, the
password hidden, and the settings that validate and name the store with them."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from app.core.database_url import describe, is_postgres_url, redact
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
        # libpq takes the password as a query parameter too, and other secrets beside it
        ("postgresql://postgres@host/db?password=hunter2", "postgresql://postgres@host/db?password=***"),
        (
            "postgresql://u@h/db?sslmode=require&sslpassword=k&PassFile=/p&application_name=a",
            "postgresql://u@h/db?sslmode=require&sslpassword=***&PassFile=***&application_name=a",
        ),
        ("postgresql://u:a/b@db/x", "postgresql://u:***@db/x"),  # "/" in the password
        ("postgresql://u:p@ss@db/x?sslkey=/k", "postgresql://u:***@db/x?sslkey=***"),
        ("postgresql://u:p@h1:1,h2:2/db#x", "postgresql://u:***@h1:1,h2:2/db#***"),
        ("host=db user=u password=secret dbname=x", "host=db user=u password=*** dbname=x"),
        ("host=db password = 'a b' dbname=x", "host=db password = *** dbname=x"),
    ],
    ids=[
        "password", "user-only", "no-user", "query-password", "query-secrets",
        "slash-in-password", "at-in-password", "multi-host-fragment", "dsn", "dsn-quoted",
    ],
)  # fmt: skip
def test_redact_hides_every_secret_part(url, shown):
    assert redact(url) == shown


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://user:s3cret@db:5432/x?password=s3cret&sslpassword=s3cret",
        "postgresql://user@db:5432/x?password=s3cret",
        "postgresql://user:s3cret@db:5432/x",
    ],
)
def test_answers_name_the_database_not_the_url(url):
    # What 503 storage_unavailable bodies and /health/ready say: no user, no secret,
    # no parameter.
    from app.storage.postgres import PostgresStore

    store = PostgresStore(url)
    assert store.where == describe(url) == "the PostgreSQL database x at db:5432"
    assert "s3cret" not in store.where and "user" not in store.where


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
