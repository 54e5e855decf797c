"""``datarax-serve`` settings: every setting a flag, bad values one clear line and exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import load_settings

ROOT = Path(__file__).resolve().parents[2]


def test_flags_override_environment(monkeypatch):
    monkeypatch.setenv("DATARAX_PORT", "9100")
    monkeypatch.setenv("DATARAX_API_TOKEN", "secret")
    settings = load_settings(
        [
            "--cpu-devices",
            "4",
            "--num-processes",
            "2",
            "--coordinator",
            "h:1",
            "--process-id",
            "1",
            "--host",
            "0.0.0.0",
        ]
    )
    assert (settings.port, settings.cpu_devices, settings.host) == (9100, 4, "0.0.0.0")
    assert (settings.num_processes, settings.process_id, settings.coordinator) == (2, 1, "h:1")
    assert settings.api_token.get_secret_value() == "secret"


@pytest.mark.parametrize(
    ("env", "argv", "fragment"),
    [
        ({"DATARAX_PORT": "abc"}, [], "DATARAX_PORT / --port"),
        ({}, ["--cpu-devices", "0"], "DATARAX_CPU_DEVICES / --cpu-devices"),
        ({}, ["--process-id", "3", "--num-processes", "2", "--coordinator", "h:1"], "below"),
        # issue 41: settings that started a broken service
        ({}, ["--step-timeout-s", "inf"], "DATARAX_STEP_TIMEOUT_S / --step-timeout-s"),
        ({}, ["--max-body-mb", "inf"], "DATARAX_MAX_BODY_MB / --max-body-mb"),
        ({"DATARAX_MAX_ANSWER_MB": "nan"}, [], "DATARAX_MAX_ANSWER_MB"),
        ({}, ["--port", "70000"], "DATARAX_PORT / --port"),
        ({"DATARAX_API_TOKEN": ""}, [], "empty or blank"),
        ({"DATARAX_API_TOKEN": "   "}, [], "empty or blank"),
    ],
    ids=[
        "bad-env",
        "bad-flag",
        "cross-field",
        "inf-timeout",
        "inf-body",
        "nan-answer",
        "port-range",
        "empty-token",
        "blank-token",
    ],  # fmt: skip
)
def test_bad_settings_are_one_line_and_exit_2(env, argv, fragment):
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", *argv],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("datarax-serve: invalid setting") and fragment in lines[0]


def test_api_token_is_not_a_flag():
    with pytest.raises(SystemExit):
        load_settings(["--api-token", "x"])


def test_version_prints_the_package_and_jax_versions_and_exits_0():
    from app.core.version import versions

    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "--version"],
        env={**os.environ, "DATARAX_PORT": "abc"},  # settings are not even read
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    v = versions()
    assert result.stdout.strip() == (
        f"datarax-serve {v['version']} (jax {v['jax']}, jaxlib {v['jaxlib']}, python {v['python']})"
    )
    assert "not installed" not in result.stdout


def test_help_reads_like_a_command_lines_help():
    """``--help``: a one-line summary first, no Sphinx roles or reST markup, and every
    setting as a flag with its environment variable (the token: environment only)."""
    from app.core.settings import Settings

    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert text.startswith("usage: datarax-serve"), text[:200]
    description = text.split("\n\n", 2)[1]  # the paragraph after the usage lines
    assert description.startswith("Serve the datarax mesh service"), description
    for markup in (":class:", ":func:", ":mod:", "``", "`~", ":data:"):
        assert markup not in text, markup
    flat = " ".join(text.split())  # argparse wraps long help lines
    for name in Settings.model_fields:
        if name == "api_token":
            assert "--api-token" not in text and "DATARAX_API_TOKEN only" in flat
            continue
        flag = "--" + name.replace("_", "-")
        assert flag in text, flag
        assert Settings.model_fields[name].description, f"{flag} has no help text"
        assert f"[env: DATARAX_{name.upper()}]" in flat, name
    assert "{str,null}" not in text and "{int,null}" not in text  # optional types
