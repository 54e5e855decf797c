"""The memory estimate against XLA's compile-time figure for production-shaped runs
(``benchmarks/production_memory.py``: 7B-70B named models, 4k-8k sequences, MaxText's
remat policies and offload, on v5e, v5p and v6e topologies libtpu describes here).

Each run is compiled for real through libtpu (about half a minute to a minute and a half
each on two cores); without libtpu the module skips loudly (fails when ``CI=true``).

XLA's figures for a run are compiled once per suite and kept in pytest's cache
(``tests/production_compiles.py``): a later session with the same sources and versions reads
them instead of compiling again."""

from __future__ import annotations

import importlib.util
import os

import pytest

from benchmarks import production_memory
from tests.production_compiles import xla_figures

pytestmark = pytest.mark.slow


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
    return [production_memory.compare(run, xla_figures(request.config, run))
            for run in production_memory.SUITE_RUNS]  # fmt: skip


@pytest.mark.timeout(2700)  # the first test compiles every suite run (the fixture)
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
