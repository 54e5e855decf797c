"""The runtime process's environment and settings.

The HTTP process imports this module to spawn the runtime, so it stays light: no JAX, no
numpy, nothing of the rest of :mod:`app.runtime`.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Mapping
from pathlib import Path

from app.core.settings import Settings

_DEVICE_COUNT_FLAG = re.compile(r"\s*--xla_force_host_platform_device_count=\S*")

_settings: Settings | None = None

TPU_PLUGINS = ("libtpu",)
CUDA_PLUGINS = ("jax-cuda12-pjrt", "jax-cuda13-pjrt", "jax-cuda12-plugin", "jax-cuda13-plugin")
ROCM_PLUGINS = ("jax-rocm7-pjrt", "jax-rocm7-plugin")
_GOOGLE_PCI_VENDOR = "0x1ae0"  # TPU chips: Google's vendor id, class 0x12 (processing accel.)


def _installed(distributions: tuple[str, ...]) -> bool:
    for name in distributions:
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return True
    return False


def _has_tpu_chips(root: Path) -> bool:
    """TPU chips on this host: ``/dev/accel*`` (TPU v2-v4 VMs) or a Google PCI device of
    class "processing accelerator" (v5e and later expose them through vfio instead); the
    same test as the Makefile's ``ACCEL`` detection."""
    if any((root / "dev").glob("accel[0-9]*")):
        return True
    for device in (root / "sys/bus/pci/devices").glob("*"):
        try:
            vendor = (device / "vendor").read_text().strip()
            kind = (device / "class").read_text().strip()
        except OSError:
            continue
        if vendor == _GOOGLE_PCI_VENDOR and kind.startswith("0x12"):
            return True
    return False


def detect_platforms(root: Path = Path("/")) -> tuple[str, str]:
    """The JAX platforms this host can serve, from its device files and the JAX plugins
    installed, without importing JAX: ``(JAX_PLATFORMS value, why)``.

    An accelerator counts only with its plugin installed (without it JAX could not use it
    anyway): TPU chips and libtpu give ``tpu,cpu``; an NVIDIA GPU (``/dev/nvidiactl``) and
    a CUDA plugin ``cuda,cpu``; an AMD GPU (``/dev/kfd``) and a ROCm plugin ``rocm,cpu``;
    anything else ``cpu``. Naming the platforms matters because JAX without
    ``JAX_PLATFORMS`` initialises every plugin it finds: on a CPU host with libtpu installed
    that logs libtpu's ``INVALID_ARGUMENT`` errors and takes libtpu's host-wide lock
    (``/tmp/libtpu_lockfile``), which then refuses every other libtpu user of the host.

    Args:
      root: the file system root to look under (tests pass a fake one).
    """
    if _has_tpu_chips(root) and _installed(TPU_PLUGINS):
        return "tpu,cpu", "detected TPU chips and libtpu"
    if (root / "dev/nvidiactl").exists() and _installed(CUDA_PLUGINS):
        return "cuda,cpu", "detected an NVIDIA GPU and a JAX CUDA plugin"
    if (root / "dev/kfd").exists() and _installed(ROCM_PLUGINS):
        return "rocm,cpu", "detected an AMD GPU and a JAX ROCm plugin"
    return "cpu", "no accelerator with a JAX plugin detected"


def runtime_platforms(settings: Settings, base: Mapping[str, str]) -> tuple[str, str]:
    """``JAX_PLATFORMS`` for the serving runtime and where it comes from.

    In order: ``DATARAX_PLATFORMS`` (``settings.platforms``); a non-empty ``JAX_PLATFORMS``
    already in ``base`` (JAX's own variable, set by the operator); else
    :func:`detect_platforms`. Never unset: the runtime initialises only what it serves.
    """
    if settings.platforms:
        return settings.platforms, "DATARAX_PLATFORMS"
    inherited = (base.get("JAX_PLATFORMS") or "").strip()
    if inherited:
        return inherited, "JAX_PLATFORMS of the environment"
    return detect_platforms()


def runtime_environment(settings: Settings, base: Mapping[str, str]) -> dict[str, str]:
    """The environment a runtime process needs, derived from ``base`` (usually os.environ).

    Simulates ``settings.cpu_devices`` host devices (``XLA_FLAGS``: any existing device
    count is replaced, other flags kept; the flag only affects the CPU backend, so it is
    harmless on GPU/TPU hosts) and always sets ``JAX_PLATFORMS``
    (:func:`runtime_platforms`), whoever started the service and however.

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
    env["JAX_PLATFORMS"] = runtime_platforms(settings, base)[0]
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
