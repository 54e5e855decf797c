"""Schemathesis against the real ``datarax-serve``: every phase (examples, coverage,
fuzzing, stateful) and every check, without a token and with one
(``DATARAX_API_TOKEN``), 0 failures.

The run is bounded for CI (2 cores): a few examples per operation, short stateful
scenarios, a fixed seed so a failure reproduces. Settings that the schema cannot carry
(operations whose 422 answers a rule between members) are in ``schemathesis.toml`` beside
this file, each with its reason. The dashboard's HTML routes are not in the OpenAPI
document, so schemathesis does not see them (tests/e2e/test_dashboard.py covers them).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ServiceProcess

CONFIG = Path(__file__).with_name("schemathesis.toml")
PHASES = ("Examples", "Coverage", "Fuzzing", "Stateful")
TOKEN = "st-token-0123456789"
SEED = "20261201"
RUN_TIMEOUT_S = 240


def _st_command() -> list[str]:
    script = Path(sys.executable).parent / "st"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "schemathesis.cli"]


def _run_schemathesis(server: ServiceProcess, tmp_path: Path, token: str | None) -> str:
    command = [
        *_st_command(),
        "--config-file",
        str(CONFIG),
        "run",
        f"{server.base_url}/openapi.json",
        "--checks",
        "all",
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--max-examples",
        "5",
        "--workers",
        "2",
        "--seed",
        SEED,
        "--request-timeout",
        "60",
        "--max-response-time",
        "30",
        "--no-color",
        "--report",
        "junit",
        "--report-dir",
        str(tmp_path / "report"),
    ]
    if token is not None:
        command += ["--header", f"Authorization: Bearer {token}"]
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    done = subprocess.run(
        command,
        cwd=tmp_path,  # its own files (reports) stay out of the work tree
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, (
        f"schemathesis found failures (exit {done.returncode}):\n{output[-20000:]}\n"
        f"--- server log ---\n{server.log_tail()}"
    )
    for phase in PHASES:
        # A phase that was skipped (nothing to test, no links) would show another mark.
        assert f"✅  {phase}" in output, f"phase {phase} did not run and pass:\n{output[-6000:]}"
    selected = re.search(r"Selected: (\d+)/(\d+)", output)
    tested = re.search(r"Tested: (\d+)", output)
    assert selected and tested, output[-4000:]
    assert selected[1] == selected[2] == tested[1], f"operations left untested:\n{output[-4000:]}"
    return output


@pytest.mark.slow
@pytest.mark.parametrize("token", [None, TOKEN], ids=["no-token", "token"])
def test_schemathesis_all_phases_all_checks(tmp_path: Path, token: str | None) -> None:
    env = {} if token is None else {"DATARAX_API_TOKEN": token}
    with ServiceProcess(tmp_path / "st.sqlite", tmp_path / "server.log", env=env) as server:
        server.wait_ready()
        with server.client() as client:
            document = client.get("/openapi.json").json()
        # With a token the document declares bearer auth, so ignored_auth (in --checks all)
        # also sends each request without it and expects a 401.
        schemes = document.get("components", {}).get("securitySchemes", {})
        assert bool(schemes) == (token is not None), schemes
        _run_schemathesis(server, tmp_path, token)
