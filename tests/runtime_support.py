"""What the tests of real runtime processes share (``tests/app/runtime/`` and
``tests/app/workers/test_runtime_client.py``): settings, a runtime driven from its own
event loop, waiting for a process to end, and the fixtures over them (``shared_runtime``,
``start_runtime``, ``settings_in``), which each of those folders' ``conftest.py`` imports.

``shared_runtime`` serves every test that leaves its runtime running (one start per
folder's session); tests that kill, time out or stop a runtime start their own with
``start_runtime``. Every runtime is stopped at teardown, by process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.core.settings import Settings
from app.workers.runtime_client import RuntimeClient
from tests.helpers import make_settings, pid_alive
from tests.runtime_commands import MODULE as TEST_COMMANDS

READY_S = 120.0
"""How long a test waits for a runtime (or a group) to become ready."""


def runtime_settings(tmp: Path, **overrides: Any) -> Settings:
    """Settings of a test runtime: 8 CPU devices, a database (and compile cache) in ``tmp``."""
    values: dict[str, Any] = {"step_timeout_s": 120.0, "runtime_start_timeout_s": READY_S}
    values.update(overrides)
    return make_settings(tmp, **values)


class RuntimeHandle:
    """A started :class:`RuntimeClient` and the private event loop it lives in, so that a
    runtime can outlive one test (module- and session-scoped fixtures).

    Args:
      settings: the runtime's settings.
      command_modules: extra command modules; the test commands by default.
    """

    def __init__(self, settings: Settings, command_modules: Iterable[str] = (TEST_COMMANDS,)):
        self.loop = asyncio.new_event_loop()
        self.client = RuntimeClient(settings, command_modules=command_modules)
        self.run(self.client.start(), 60)

    def run(self, awaitable: Awaitable[Any], timeout: float = 60.0) -> Any:
        """Runs ``awaitable`` in this runtime's loop, failing after ``timeout`` seconds."""
        return self.loop.run_until_complete(asyncio.wait_for(awaitable, timeout))

    def wait_ready(self, timeout: float = READY_S) -> bool:
        return self.run(self.client.wait_ready(timeout), timeout + 5)

    def call(
        self,
        command: str,
        payload: dict | None = None,
        arrays: dict[str, np.ndarray] | None = None,
        *,
        timeout: float = 300.0,
    ) -> tuple[dict, dict[str, np.ndarray]]:
        """``client.call(...)``, bounded by ``timeout`` from the head of the queue."""
        return self.run(self.client.call(command, payload, arrays, timeout=timeout), timeout + 30)

    def body(self, body: Callable[[RuntimeClient], Awaitable[None]], limit: float = 60.0) -> None:
        """Runs ``body(client)`` in this runtime's loop, bounded by ``limit`` seconds."""
        self.run(body(self.client), limit)

    def seconds_until_not_ready(self, limit: float) -> float:
        """Polls readiness (the loop runs meanwhile) until it drops or ``limit`` passes."""

        async def poll() -> float:
            start = time.monotonic()
            # The client has an event for readiness, none for its loss: poll.
            while self.client.ready and time.monotonic() - start < limit:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            return time.monotonic() - start

        return self.run(poll(), limit + 5)

    def close(self) -> None:
        """Stops the runtime (its process group) and closes the loop."""
        with contextlib.suppress(Exception):
            self.run(self.client.stop(), 30)
        self.loop.close()


def pid_gone(pid: int, within: float = 10.0) -> bool:
    """Whether process ``pid`` ends (or is a zombie) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# ------------------------------------------------------------------------------ fixtures


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
