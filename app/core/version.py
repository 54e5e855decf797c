"""The versions ``datarax-serve --version`` prints and ``datarax_build_info`` exports.

Read from installed package metadata, never by importing JAX: the HTTP process must not
start a JAX backend.
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform

DISTRIBUTION = "datarax-mesh"


def _installed(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


@functools.cache
def versions() -> dict[str, str]:
    """``{"version", "jax", "jaxlib", "python"}``: this package's version and its runtime's."""
    return {
        "version": _installed(DISTRIBUTION),
        "jax": _installed("jax"),
        "jaxlib": _installed("jaxlib"),
        "python": platform.python_version(),
    }


def package_version() -> str:
    """This package's version (``/openapi.json``'s ``info.version``, the ``/docs`` page):
    the installed distribution's, else ``0+unknown`` (a source tree never installed)."""
    found = versions()["version"]
    return "0+unknown" if found == "not installed" else found


def version_line() -> str:
    """One line, e.g. ``datarax-serve 0.1.0 (jax 0.8.1, jaxlib 0.8.1, python 3.12.1)``."""
    v = versions()
    return (
        f"datarax-serve {v['version']} (jax {v['jax']}, jaxlib {v['jaxlib']}, python {v['python']})"
    )
