"""Starting ``datarax-serve`` on a shared PostgreSQL store (issue 42), for real.

- Three replicas started together on an empty database all come up, the schema created
  once (``datarax_schema`` holds one row), and each reads what another stored.
- A database that cannot be reached: exit 69 with one line naming the URL, its password
  never printed.
- A database holding tables that are not the service's: exit 65 with one line, the
  database left exactly as it was.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from app.cli import EXIT_BAD_DATABASE, EXIT_DATABASE_UNREACHABLE
from app.storage.migrations import SCHEMA_VERSION
from tests.helpers import ServiceProcess, free_port

pytestmark = pytest.mark.timeout(240)

PASSWORD = "s3cret-Pw-42"


def _with_password(url: str) -> str:
    """``url`` with a password added (the test server trusts every local connection, so
    a password is accepted and ignored: only whether it is printed matters)."""
    scheme, rest = url.split("://", 1)
    user, host = rest.split("@", 1)
    return f"{scheme}://{user}:{PASSWORD}@{host}"


def _serve_once(tmp_path: Path, url: str, *, flag: bool) -> subprocess.CompletedProcess:
    """``datarax-serve`` on ``url`` (in the environment, or as ``--database-url``), run to
    its exit."""
    service = ServiceProcess(tmp_path / "datarax.sqlite", tmp_path / "server.log")
    command = service.command()
    env = {**os.environ, "DATARAX_PLATFORMS": "cpu", "JAX_PLATFORMS": "cpu"}
    if flag:
        command += ["--database-url", url]
    else:
        env["DATARAX_DATABASE_URL"] = url
    return subprocess.run(
        command, capture_output=True, text=True, timeout=120, env=env, check=False
    )


def _one_line(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stderr
    return lines[0]


def test_replicas_starting_together_on_an_empty_database_create_the_schema_once(
    postgres_url, tmp_path
):
    env = {"DATARAX_DATABASE_URL": postgres_url}
    replicas = [
        ServiceProcess(tmp_path / f"r{i}" / "datarax.sqlite", tmp_path / f"r{i}.log", env=env)
        for i in range(3)
    ]
    for replica in replicas:
        replica.db.parent.mkdir()
    started = time.monotonic()
    try:
        for replica in replicas:  # all at once: they race for the schema
            replica.start()
        for replica in replicas:
            replica.wait_ready()
        print(f"3 replicas ready {time.monotonic() - started:.1f} s after their start")
        with psycopg.connect(postgres_url) as conn:
            rows = conn.execute("SELECT version FROM datarax_schema").fetchall()
            tables = {
                r[0]
                for r in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
                )
            }
        assert rows == [(SCHEMA_VERSION,)]
        assert {"plans", "jobs", "job_points", "datarax_schema"} <= tables
        for i, replica in enumerate(replicas):  # each stores, every other reads it
            with replica.client() as client:
                body = {"step": i, "metrics": {"loss": [float(i), i + 1.0]}}
                answer = client.post("/v1/jobs/started/metrics", json=body)
                assert answer.status_code == 201, (answer.text, replica.log_tail())
        for replica in replicas:
            with replica.client() as client:
                points = client.get("/v1/jobs/started/metrics").json()["points"]
                assert [(p["step"], p["reduced"]) for p in points] == [
                    (i, {"loss": i + 0.5}) for i in range(3)
                ]
                assert client.get("/v1/jobs/started").json()["points"] == 3
    finally:
        for replica in replicas:
            replica.stop()


@pytest.mark.parametrize(
    ("flag", "form"),
    [(False, "userinfo"), (True, "userinfo"), (False, "query")],
    ids=["env", "flag", "query-password"],
)
def test_an_unreachable_database_exits_69_with_one_line_naming_it_without_password(
    tmp_path, flag, form
):
    port = free_port()  # nothing listens there
    url = (
        f"postgresql://datarax:{PASSWORD}@127.0.0.1:{port}/nowhere"
        if form == "userinfo"  # libpq takes the password as a query parameter too
        else f"postgresql://datarax@127.0.0.1:{port}/nowhere?password={PASSWORD}"
    )
    done = _serve_once(tmp_path, url, flag=flag)
    assert done.returncode == EXIT_DATABASE_UNREACHABLE, (done.returncode, done.stderr[-3000:])
    line = _one_line(done)
    print(line)
    # The database named, never its URL (issue 58: no user, no secret, no parameter).
    assert f"the PostgreSQL database nowhere at 127.0.0.1:{port}" in line, line
    assert "datarax" not in line.split("nowhere")[0].split("PostgreSQL")[-1], line
    assert PASSWORD not in done.stderr + done.stdout
    log = tmp_path / "server.log"
    assert not log.exists() or PASSWORD not in log.read_text(errors="replace")


def test_a_database_of_foreign_tables_exits_65_and_is_left_untouched(postgres_url, tmp_path):
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE invoices (id int PRIMARY KEY, amount numeric)")
        conn.execute("INSERT INTO invoices VALUES (1, 9.5), (2, 120)")
        conn.execute("CREATE INDEX invoices_amount ON invoices (amount)")

    def snapshot() -> tuple:
        with psycopg.connect(postgres_url) as conn:
            objects = conn.execute(
                "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE n.nspname = 'public' ORDER BY 1"
            ).fetchall()
            rows = conn.execute("SELECT id, amount FROM invoices ORDER BY id").fetchall()
        return objects, rows

    before = snapshot()
    done = _serve_once(tmp_path, _with_password(postgres_url), flag=False)
    assert done.returncode == EXIT_BAD_DATABASE, (done.returncode, done.stderr[-3000:])
    line = _one_line(done)
    print(line)
    assert "invoices" in line and "untouched" in line, line
    assert postgres_url.rsplit("/", 1)[1] in line  # names the database
    assert PASSWORD not in done.stderr + done.stdout
    assert snapshot() == before
