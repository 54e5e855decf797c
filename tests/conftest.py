"""Test set-up: 8 simulated CPU devices, fixed before JAX initialises its backends."""

import os

os.environ["JAX_PLATFORMS"] = "cpu"
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import pytest  # noqa: E402

NUM_DEVICES = 8

# Fixtures shared by the service tests (``api``, ...).
pytest_plugins = ["tests.helpers"]


def require_devices(n: int) -> None:
    """Skip loudly (with the numbers) when fewer than ``n`` devices exist."""
    have = jax.device_count()
    if have < n:
        pytest.skip(f"needs {n} devices, this process has {have}")


@pytest.fixture(scope="session")
def eight_devices():
    require_devices(NUM_DEVICES)
    return jax.devices()[:NUM_DEVICES]
