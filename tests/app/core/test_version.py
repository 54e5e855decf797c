"""Versions from package metadata, without importing JAX."""

from __future__ import annotations

import importlib.metadata
import platform

from app.core.version import package_version, version_line, versions


def test_versions_are_the_installed_distributions():
    found = versions()
    assert found["version"] == importlib.metadata.version("datarax-mesh")
    assert found["jax"] == importlib.metadata.version("jax")
    assert found["jaxlib"] == importlib.metadata.version("jaxlib")
    assert found["python"] == platform.python_version()


def test_package_version_and_the_version_line():
    found = versions()
    assert package_version() == found["version"]
    line = version_line()
    assert line.startswith(f"datarax-serve {found['version']} (jax {found['jax']},")
    assert line.endswith(f"python {found['python']})")
