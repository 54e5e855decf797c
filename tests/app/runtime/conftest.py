"""Fixtures for tests that start real runtime processes (8 simulated CPU devices each).

``shared_runtime`` serves every test that leaves its runtime running (one start for the
whole session); tests that kill, time out or stop a runtime start their own with
``start_runtime``. Every runtime is stopped at teardown, by process group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.core.settings import Settings
from tests.app.runtime.support import RuntimeHandle, runtime_settings


@pytest.fixture(scope="session")
def shared_runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeHandle]:
    """One ready runtime (default budgets, test commands) for tests that keep it alive."""
    handle = RuntimeHandle(runtime_settings(tmp_path_factory.mktemp("shared-runtime")))
    try:
        assert handle.wait_ready(), "the shared runtime did not become ready"
        yield handle
    finally:
        handle.close()


@pytest.fixture
def start_runtime(tmp_path: Path) -> Iterator[Callable[..., RuntimeHandle]]:
    """``start_runtime(**settings overrides)``: a private runtime, ready; stopped after."""
    handles: list[RuntimeHandle] = []

    def start(**overrides: object) -> RuntimeHandle:
        handle = RuntimeHandle(runtime_settings(tmp_path / f"rt{len(handles)}", **overrides))
        handles.append(handle)
        assert handle.wait_ready(), "runtime did not become ready"
        return handle

    try:
        yield start
    finally:
        for handle in handles:
            handle.close()


@pytest.fixture
def settings_in(tmp_path: Path) -> Callable[..., Settings]:
    """``settings_in(**overrides)``: test runtime settings under this test's ``tmp_path``."""
    return lambda **overrides: runtime_settings(tmp_path, **overrides)
