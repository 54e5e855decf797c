"""The runtime process's environment and settings.

The HTTP process imports this module to spawn the runtime, so it stays light: no JAX, no
numpy, nothing of the rest of :mod:`app.runtime`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from app.settings import Settings

_DEVICE_COUNT_FLAG = re.compile(r"\s*--xla_force_host_platform_device_count=\S*")

_settings: Settings | None = None


def runtime_environment(settings: Settings, base: Mapping[str, str]) -> dict[str, str]:
    """The environment a runtime process needs, derived from ``base`` (usually os.environ).

    Simulates ``settings.cpu_devices`` host devices (``XLA_FLAGS``: any existing device
    count is replaced, other flags kept; the flag only affects the CPU backend, so it is
    harmless on GPU/TPU hosts) and sets ``JAX_PLATFORMS`` when ``settings.platforms`` is set.

    Args:
      settings: the service settings.
      base: the environment to start from; not modified.

    Returns:
      A new environment mapping.
    """
    env = dict(base)
    flags = _DEVICE_COUNT_FLAG.sub("", env.get("XLA_FLAGS", "")).strip()
    count = f"--xla_force_host_platform_device_count={settings.cpu_devices}"
    env["XLA_FLAGS"] = f"{flags} {count}".strip()
    if settings.platforms:
        env["JAX_PLATFORMS"] = settings.platforms
    return env


def use_settings(settings: Settings) -> None:
    """Makes ``settings`` the ones :func:`settings` answers (once, at runtime start)."""
    global _settings
    _settings = settings


def settings() -> Settings:
    """The settings this runtime process was started with.

    Raises:
      RuntimeError: outside a runtime process (nothing called :func:`use_settings`).
    """
    if _settings is None:
        raise RuntimeError("runtime settings are only available inside the runtime process")
    return _settings
