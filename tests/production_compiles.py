"""XLA's figures for the production-shaped runs of ``benchmarks/production_memory.py``,
compiled once per suite (and per change of what they depend on) for every test that reads
them: ``tests/datarax/test_production_memory.py`` compares all of them with the estimate,
``tests/datarax/spmd/test_compile_step.py`` checks two of them in detail.

The figures are kept in pytest's cache (``.pytest_cache``; nothing is kept with
``-p no:cacheprovider``) under a key of everything they depend on: the run, the sources of
``datarax/`` and of the benchmark, the versions of JAX, libtpu and the libraries that build
the program, and the XLA flags. Each run's file is written under an exclusive lock, so two
pytest-xdist workers (or two sessions) asking for one run compile it once: the second waits
and reads it. Any change to the code or a version compiles afresh."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import sys
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from benchmarks import production_memory

ROOT = Path(__file__).resolve().parents[1]
_SOURCES = (ROOT / "datarax", ROOT / "benchmarks" / "production_memory.py")
_LIBRARIES = ("jax", "jaxlib", "libtpu", "flax", "optax", "numpy", "ml_dtypes")
_COMPILE_ENV = ("XLA_FLAGS", "LIBTPU_INIT_ARGS", "JAX_PLATFORMS", "JAX_ENABLE_X64")


@cache
def inputs_digest() -> str:
    """SHA-256 of what XLA's figures depend on besides the run itself."""
    digest = hashlib.sha256()
    files = sorted(
        path for root in _SOURCES for path in ([root] if root.is_file() else root.rglob("*.py"))
    )
    for path in files:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    for name in _LIBRARIES:
        digest.update(f"{name}={importlib.metadata.version(name)}\0".encode())
    for name in _COMPILE_ENV:
        digest.update(f"{name}={os.environ.get(name, '')}\0".encode())
    digest.update(sys.version.encode())
    return digest.hexdigest()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path``: processes sharing the cache compile a run once."""
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def run_by_id(run_id: str) -> dict[str, Any]:
    """The run of ``production_memory.RUNS`` named ``run_id``."""
    return next(run for run in production_memory.RUNS if run["id"] == run_id)


def xla_figures(config: pytest.Config, run: Mapping[str, Any]) -> dict[str, Any]:
    """``production_memory.compile_run(run)``, read from pytest's cache when it holds it."""
    cache_provider = getattr(config, "cache", None)
    if cache_provider is None:
        return production_memory.compile_run(run)
    folder = cache_provider.mkdir("production_memory")
    key = hashlib.sha256((inputs_digest() + json.dumps(run, sort_keys=True)).encode())
    path = folder / f"{run['id']}-{key.hexdigest()[:24]}.json"
    with _locked(folder / f"{run['id']}.lock"):
        with contextlib.suppress(FileNotFoundError, ValueError):
            return json.loads(path.read_text())
        figures = production_memory.compile_run(run)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps(figures))
        partial.replace(path)  # whole or absent, should the session die meanwhile
        for stale in folder.glob(f"{run['id']}-*.json"):  # figures of code that changed
            if stale != path:
                stale.unlink(missing_ok=True)
        return figures
