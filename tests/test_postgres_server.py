"""The real PostgreSQL the shared store's tests run against (tests/postgres_server.py): it
starts, accepts connections, hands out isolated databases, keeps a committed row through a
crash (SIGKILL, then a restart that recovers from the WAL), and leaves no server and no
folder behind: not after ``close()``, and not after its pytest process is SIGKILLed."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import NoReturn

import psycopg
import pytest

from tests import postgres_server as postgres_server_module
from tests.postgres_fixtures import new_postgres_server
from tests.postgres_server import SERVER_USER, SYSTEM_USER, PostgresServer

PROJECT_ROOT = Path(__file__).resolve().parent.parent
GONE_TIMEOUT_S = 30.0


def _user_tables(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()
    return sorted(name for (name,) in rows)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _running(pid)


def test_the_server_accepts_connections_as_configured(postgres_server: PostgresServer) -> None:
    assert postgres_server.running
    assert postgres_server.url("x") == f"postgresql://datarax@127.0.0.1:{postgres_server.port}/x"
    with psycopg.connect(postgres_server.url()) as conn:
        assert conn.info.server_version >= 130000, conn.info.server_version
        settings = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
            for name in ("fsync", "listen_addresses", "max_connections", "server_encoding")
        }
        user = conn.execute("SELECT current_user").fetchone()
    assert settings == {
        "fsync": "on",
        "listen_addresses": "127.0.0.1",
        "max_connections": "200",
        "server_encoding": "UTF8",
    }
    assert user == (SERVER_USER,)


def test_the_server_runs_as_an_unprivileged_user(postgres_server: PostgresServer) -> None:
    assert postgres_server.process is not None
    with open(f"/proc/{postgres_server.process.pid}/status") as f:
        uids = next(line for line in f if line.startswith("Uid:")).split()[1:]
    assert "0" not in uids, uids
    if os.geteuid() == 0:
        assert postgres_server.data_dir.owner() == SYSTEM_USER
        assert postgres_server.socket_dir.owner() == SYSTEM_USER
    else:
        assert postgres_server.data_dir.stat().st_uid == os.geteuid()


def test_each_database_is_fresh_and_isolated(postgres_server: PostgresServer) -> None:
    first, second = postgres_server.create_database(), postgres_server.create_database()
    assert first != second
    with psycopg.connect(first) as conn:
        conn.execute("CREATE TABLE only_here (x int)")
    assert _user_tables(first) == ["only_here"]
    assert _user_tables(second) == []
    named = postgres_server.create_database("named_by_the_test")
    assert named == postgres_server.url("named_by_the_test")


def test_postgres_url_is_an_empty_database_dropped_after_the_test(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    assert postgres_url.startswith(postgres_server.url(""))
    assert _user_tables(postgres_url) == []


def test_a_committed_row_survives_a_crash_and_a_restart(own_postgres: PostgresServer) -> None:
    url = own_postgres.create_database()
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE t (x int)")
        conn.execute("INSERT INTO t VALUES (1)")
    pending = psycopg.connect(url)  # a transaction open (not committed) at the crash
    pending.execute("INSERT INTO t VALUES (2)")
    port = own_postgres.port

    own_postgres.kill()
    assert not own_postgres.running
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=2).close()
    with pytest.raises(psycopg.OperationalError):
        pending.execute("INSERT INTO t VALUES (3)")
    pending.close()

    own_postgres.restart()
    assert own_postgres.port == port
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT x FROM t").fetchall() == [(1,)]
    assert "automatic recovery in progress" in own_postgres.log_tail(20_000)


def test_stop_and_restart_keep_data_and_port(own_postgres: PostgresServer) -> None:
    url = own_postgres.create_database()
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE kept (x int)")
    own_postgres.stop()
    assert not own_postgres.running
    own_postgres.restart()
    assert own_postgres.running
    assert url == own_postgres.url(url.rsplit("/", 1)[1])
    assert _user_tables(url) == ["kept"]


def test_close_stops_the_server_and_removes_its_folder() -> None:
    server = new_postgres_server()
    with server:
        base, process, url = server.base, server.process, server.url()
        assert base is not None and process is not None and base.is_dir()
    assert not base.exists()
    assert process.poll() is not None
    assert not server.running
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=2).close()
    server.close()  # a second close does nothing


def test_no_server_outlives_a_killed_test_process() -> None:
    """A pytest worker that dies by SIGKILL (no atexit, no teardown) takes its server with
    it: the kernel signals the postmaster when the thread that started it dies."""
    new_postgres_server()  # skips (fails under CI) without PostgreSQL
    child = textwrap.dedent(
        """
        import sys, time
        from tests.postgres_server import PostgresServer
        server = PostgresServer().start()
        print(server.process.pid, server.base, flush=True)
        time.sleep(600)
        """
    )
    worker = subprocess.Popen(
        [sys.executable, "-c", child], cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert worker.stdout is not None
        line = worker.stdout.readline()
    finally:
        worker.kill()  # SIGKILL: no atexit, no fixture teardown
        worker.wait(30)
    assert line, "the child process did not start a server (its error is above)"
    pid, base = line.split()
    try:
        assert _wait_gone(int(pid)), f"postmaster {pid} outlived its SIGKILLed process"
    finally:
        if _running(int(pid)):
            os.kill(int(pid), signal.SIGQUIT)
        shutil.rmtree(base, ignore_errors=True)  # the one thing a SIGKILL leaves behind


@pytest.mark.parametrize("ci", ["", "true"])
def test_missing_binaries_skip_loudly_here_and_fail_under_ci(
    monkeypatch: pytest.MonkeyPatch, ci: str
) -> None:
    def missing() -> Path:
        raise postgres_server_module.PostgresUnavailable(
            f"PostgreSQL not installed: {postgres_server_module.PACKAGE_HINT}"
        )

    monkeypatch.setattr(postgres_server_module, "find_bin_dir", missing)
    monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(expected, match="apt-get install -y postgresql"):
        new_postgres_server()


def test_root_without_the_postgres_user_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_such_user(name: str) -> NoReturn:
        raise KeyError(name)

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(pwd, "getpwnam", no_such_user)
    with pytest.raises(RuntimeError, match="no 'postgres' system user"):
        PostgresServer(bin_dir=Path("/nonexistent"))
