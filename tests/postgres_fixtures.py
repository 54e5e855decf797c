"""Fixtures for tests that need a real PostgreSQL (the shared store, DATARAX_DATABASE_URL).

tests/conftest.py loads them for every test folder (``pytest_plugins``):

- ``postgres_server`` (session): one running ``PostgresServer`` per test process (each
  pytest-xdist worker starts its own, on its own port and folder), closed at the end.
- ``postgres_url`` (function): the URL of a fresh, empty database on that server, dropped
  after the test (connections still open to it are closed), so tests do not see each
  other's rows.
- ``store_url(request)``: a context manager for fixtures parametrized over
  ``["sqlite", "postgres"]``: ``None``, or a fresh database's URL dropped after.
- ``own_postgres`` (function): a running ``PostgresServer`` of the test's own, which it
  may ``stop()``, ``kill()`` and ``restart()`` (database restarts and crashes); closed
  after the test.

Without the PostgreSQL binaries these tests skip loudly, naming the package to install;
under CI (CI=true, where .ci/run installs it) they fail instead. ``tests.postgres_server``
is imported only when a fixture runs, so that the rest of the suite loads without it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, NoReturn

import pytest

if TYPE_CHECKING:
    from tests.postgres_server import PostgresServer


def skip_or_fail_in_ci(message: str) -> NoReturn:
    """A needed tool is missing: skip loudly here, fail under CI (CI=true), which must run
    every test (the same rule as the Chromium and shellcheck tests)."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true: .ci/run installs it, so this is a failure)")
    pytest.skip(f"LOUD SKIP: {message}")


def new_postgres_server() -> PostgresServer:
    """A ``PostgresServer`` not yet started; skips (fails under CI) without PostgreSQL."""
    from tests.postgres_server import PostgresServer, PostgresUnavailable

    try:
        return PostgresServer()
    except PostgresUnavailable as missing:
        skip_or_fail_in_ci(str(missing))


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One running server for the whole test process; closed (folder removed) at its end."""
    with new_postgres_server() as server:
        yield server


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh, empty database on the session's server, dropped after the test."""
    url = postgres_server.create_database()
    yield url
    if postgres_server.running:
        postgres_server.drop_database(url.rsplit("/", 1)[1])


@contextlib.contextmanager
def store_url(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """For a fixture parametrized ``["sqlite", "postgres"]``: ``None`` (the SQLite file),
    or a fresh database on the session's server, dropped after."""
    if request.param != "postgres":
        yield None
        return
    server = request.getfixturevalue("postgres_server")
    url = server.create_database()
    try:
        yield url
    finally:
        if server.running:
            server.drop_database(url.rsplit("/", 1)[1])


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A running server of this test's own, free to stop, kill and restart; closed after."""
    with new_postgres_server() as server:
        yield server
