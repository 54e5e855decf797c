"""Fixtures for tests that start real runtime processes (8 simulated CPU devices each):
``shared_runtime``, ``start_runtime`` and ``settings_in``, defined in
:mod:`tests.runtime_support` (shared with ``tests/app/runtime/``)."""

from tests.runtime_support import settings_in, shared_runtime, start_runtime

__all__ = ["settings_in", "shared_runtime", "start_runtime"]
