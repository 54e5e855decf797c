"""The runtime's environment and settings, and what importing the client side loads."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from app.runtime import environment
from app.runtime.environment import detect_platforms, runtime_environment, runtime_platforms
from tests.helpers import PROJECT_ROOT, make_settings


def test_device_count_is_replaced_and_other_flags_kept(tmp_path):
    settings = make_settings(tmp_path)
    base = {"XLA_FLAGS": "--xla_a=1 --xla_force_host_platform_device_count=2 --xla_b=x"}
    env = runtime_environment(settings.model_copy(update={"cpu_devices": 16}), base)
    assert env["XLA_FLAGS"] == "--xla_a=1 --xla_b=x --xla_force_host_platform_device_count=16"
    assert env["JAX_PLATFORMS"] == "cpu"
    assert base["XLA_FLAGS"].endswith("--xla_b=x")  # not modified
    env = runtime_environment(settings.model_copy(update={"platforms": None}), {})
    assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8"
    assert env["JAX_PLATFORMS"] == detect_platforms()[0]  # never left unset


@pytest.mark.parametrize(
    ("platforms", "inherited", "expected", "source"),
    [
        ("cuda", "cpu", "cuda", "DATARAX_PLATFORMS"),
        (None, "tpu", "tpu", "JAX_PLATFORMS of the environment"),
        (None, "  ", None, None),
        (None, None, None, None),
    ],
    ids=["setting-wins", "inherited-jax-platforms", "blank-is-unset", "detected"],
)
def test_the_runtime_platforms_come_from_the_setting_the_environment_or_detection(
    tmp_path, platforms, inherited, expected, source
):
    settings = make_settings(tmp_path, platforms=platforms)
    base = {} if inherited is None else {"JAX_PLATFORMS": inherited}
    value, why = runtime_platforms(settings, base)
    if expected is None:  # detection: this test host has no accelerator device files
        assert (value, why) == detect_platforms()
        assert value == "cpu", (value, why)
    else:
        assert (value, why) == (expected, source)
    assert runtime_environment(settings, base)["JAX_PLATFORMS"] == value


def _fake_host(root, *, accel=False, tpu_pci=False, nvidia=False, kfd=False):
    (root / "dev").mkdir(parents=True)
    if accel:
        (root / "dev/accel0").touch()
    if nvidia:
        (root / "dev/nvidiactl").touch()
    if kfd:
        (root / "dev/kfd").touch()
    pci = root / "sys/bus/pci/devices"
    other = pci / "0000:00:01.0"
    other.mkdir(parents=True)
    (other / "vendor").write_text("0x8086\n")
    (other / "class").write_text("0x060000\n")
    if tpu_pci:
        chip = pci / "0000:00:04.0"
        chip.mkdir()
        (chip / "vendor").write_text("0x1ae0\n")
        (chip / "class").write_text("0x120000\n")
    return root


def _installed(*names):
    have = set(names)

    def version(name):
        if name in have:
            return "1.0"
        raise importlib.metadata.PackageNotFoundError(name)

    return version


@pytest.mark.parametrize(
    ("host", "installed", "expected"),
    [
        ({}, ("libtpu", "jax-cuda12-pjrt"), "cpu"),
        ({"accel": True}, ("libtpu",), "tpu,cpu"),
        ({"tpu_pci": True}, ("libtpu",), "tpu,cpu"),
        ({"tpu_pci": True}, (), "cpu"),
        ({"nvidia": True}, ("jax-cuda12-pjrt",), "cuda,cpu"),
        ({"nvidia": True}, ("libtpu",), "cpu"),
        ({"kfd": True}, ("jax-rocm7-pjrt",), "rocm,cpu"),
    ],
    ids=[
        "cpu-host-with-libtpu",
        "tpu-vm-accel",
        "tpu-vm-pci",
        "tpu-chips-without-libtpu",
        "nvidia-with-plugin",
        "nvidia-without-plugin",
        "amd-with-plugin",
    ],
)
def test_detection_names_only_platforms_with_devices_and_a_plugin(
    tmp_path, monkeypatch, host, installed, expected
):
    # The host's device files are faked under tmp_path (not this machine's); the package
    # metadata lookup answers for the named distributions only.
    monkeypatch.setattr(environment.importlib.metadata, "version", _installed(*installed))
    value, why = detect_platforms(_fake_host(tmp_path / "root", **host))
    assert value == expected, why


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
        "import sys, app.workers.runtime_client, app.workers.follower, app.runtime.environment\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'flax'))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
