"""The memory estimate against XLA's compile-time figure for production-shaped runs
(``benchmarks/production_memory.py``: 7B-70B named models, 4k-8k sequences, MaxText's
remat policies and offload, on v5e, v5p and v6e topologies libtpu describes here).

Each run is compiled for real through libtpu (about half a minute to a minute and a half
each on two cores); without libtpu the module skips loudly (fails when ``CI=true``).

XLA's figures for a run are kept in pytest's cache (``.pytest_cache``, not with
``-p no:cacheprovider``) under a key of everything they depend on: the run, the sources of
``datarax/`` and of the benchmark, the versions of JAX, libtpu and the libraries that build
the program, and the XLA flags. A later session with the same key reads them instead of
compiling again; any change to the code or a version compiles afresh."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from benchmarks import production_memory

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
_SOURCES = (ROOT / "datarax", ROOT / "benchmarks" / "production_memory.py")
_LIBRARIES = ("jax", "jaxlib", "libtpu", "flax", "optax", "numpy", "ml_dtypes")
_COMPILE_ENV = ("XLA_FLAGS", "LIBTPU_INIT_ARGS", "JAX_PLATFORMS", "JAX_ENABLE_X64")


def _inputs_digest() -> str:
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
    """An exclusive lock on ``path``: two sessions sharing the cache compile a run once."""
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _xla_figures(run: Mapping[str, Any], folder: Path | None, inputs: str) -> dict[str, Any]:
    """``production_memory.compile_run(run)``, read from ``folder`` when it holds it."""
    if folder is None:
        return production_memory.compile_run(run)
    key = hashlib.sha256((inputs + json.dumps(run, sort_keys=True)).encode()).hexdigest()
    path = folder / f"{run['id']}-{key[:24]}.json"
    folder.mkdir(parents=True, exist_ok=True)
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


@pytest.fixture(scope="module")
def compared(request: pytest.FixtureRequest):
    if importlib.util.find_spec("libtpu") is None:
        message = (
            "libtpu is not installed: production-shaped TPU compiles cannot run. Install it "
            "with `.venv/bin/pip install -c constraints.txt 'jax[tpu]==0.12.0.1'`"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    cache = getattr(request.config, "cache", None)
    folder = None if cache is None else cache.mkdir("production_memory")
    inputs = _inputs_digest()
    return [production_memory.compare(run, _xla_figures(run, folder, inputs))
            for run in production_memory.RUNS]  # fmt: skip


@pytest.mark.timeout(1800)
def test_the_estimate_is_within_10_percent_of_xla_on_80_percent_of_the_runs(compared):
    measured = [row for row in compared if row["error"] is not None]
    assert len(compared) >= 10 and len(measured) >= 8
    within = [row for row in measured if abs(row["error"]) <= 0.10]
    assert len(within) >= 0.8 * len(measured), production_memory.markdown(compared)


@pytest.mark.timeout(60)
def test_fits_agrees_with_xla_on_every_run(compared):
    disagree = [row["id"] for row in compared if row["xla_fits"] != row["estimate_fits"]]
    assert not disagree, production_memory.markdown(compared)


@pytest.mark.timeout(60)
def test_offloaded_bytes_are_what_xla_puts_in_host_memory(compared):
    offloaded = [row for row in compared if row["xla_host_bytes"]]
    assert offloaded, "no run offloads"
    for row in offloaded:
        assert row["estimate_host_bytes"] == pytest.approx(row["xla_host_bytes"], rel=0.02), row
