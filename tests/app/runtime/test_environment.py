"""The runtime's environment and settings, and what importing the client side loads."""

from __future__ import annotations

import subprocess
import sys

import pytest

from app.runtime import environment
from app.runtime.environment import runtime_environment
from tests.helpers import PROJECT_ROOT, make_settings


def test_device_count_is_replaced_and_other_flags_kept(tmp_path):
    settings = make_settings(tmp_path)
    base = {"XLA_FLAGS": "--xla_a=1 --xla_force_host_platform_device_count=2 --xla_b=x"}
    env = runtime_environment(settings.model_copy(update={"cpu_devices": 16}), base)
    assert env["XLA_FLAGS"] == "--xla_a=1 --xla_b=x --xla_force_host_platform_device_count=16"
    assert env["JAX_PLATFORMS"] == "cpu"
    assert base["XLA_FLAGS"].endswith("--xla_b=x")  # not modified
    env = runtime_environment(settings.model_copy(update={"platforms": None}), {})
    assert env == {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}


def test_settings_exist_only_inside_a_runtime(tmp_path, monkeypatch):
    monkeypatch.setattr(environment, "_settings", None)
    with pytest.raises(RuntimeError, match="only available inside the runtime process"):
        environment.settings()
    settings = make_settings(tmp_path)
    environment.use_settings(settings)
    assert environment.settings() is settings


def test_the_http_side_of_the_runtime_loads_no_jax():
    """The HTTP process imports the client (and the follower's main): neither may load
    JAX, which would initialise a backend beside the runtime's."""
    code = (
        "import sys, app.runtime_client, app.follower, app.runtime.environment\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'flax'))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
