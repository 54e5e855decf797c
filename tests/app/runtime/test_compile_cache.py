"""Compiled programs (app.runtime.compile_cache): the compiled-step LRU, XLA's memory
figures of a real compiled step, and JAX's persistent cache under the data directory (in
this process for the settings, in fresh processes for a real miss and then a hit on disk)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from app.runtime.compile_cache import (
    MAX_COMPILED_STEPS,
    PERSISTENT_MIN_COMPILE_S,
    CompiledSteps,
    compiled_peak,
    configure_persistent_cache,
)
from tests.helpers import PROJECT_ROOT

# ------------------------------------------------------------------- CompiledSteps


def test_the_default_bound_and_a_full_cache_drops_the_oldest_first():
    cache = CompiledSteps()
    assert cache.max_entries == MAX_COMPILED_STEPS == 64
    for i in range(MAX_COMPILED_STEPS + 3):
        cache.put(("step", i), i)
    assert len(cache) == MAX_COMPILED_STEPS
    assert [("step", i) in cache for i in range(3)] == [False, False, False]
    assert cache.get(("step", 3)) == 3 and cache.get(("step", MAX_COMPILED_STEPS + 2)) == (
        MAX_COMPILED_STEPS + 2
    )


@pytest.mark.parametrize("bad", [0, -1])
def test_a_bound_below_one_is_refused(bad):
    with pytest.raises(ValueError, match=f"max_entries is {bad}; it must be at least 1"):
        CompiledSteps(max_entries=bad)


def test_a_cache_of_one_keeps_only_the_last_put():
    cache = CompiledSteps(max_entries=1)
    cache.put("a", 1)
    cache.put("b", 2)
    assert len(cache) == 1 and "a" not in cache and cache.get("b") == 2


def test_keys_match_by_value_and_a_miss_inserts_nothing():
    cache = CompiledSteps(max_entries=4)
    cache.put(("mlp", (8, 16), "float32"), "exe")
    assert cache.get(("mlp", (8, 16), "float32")) == "exe"  # an equal key, another object
    assert cache.get(("mlp", (8, 16), "bfloat16")) is None
    assert ("mlp", (8, 16), "bfloat16") not in cache and len(cache) == 1


def test_putting_an_existing_key_replaces_it_and_makes_it_the_most_recent():
    cache = CompiledSteps(max_entries=2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 10)  # replaced, now the most recent: b goes next
    assert len(cache) == 2
    cache.put("c", 3)
    assert "b" not in cache and cache.get("a") == 10 and cache.get("c") == 3


def test_a_membership_test_is_not_a_use():
    cache = CompiledSteps(max_entries=2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert "a" in cache  # only get() refreshes recency
    cache.put("c", 3)
    assert "a" not in cache and "b" in cache and "c" in cache


def test_a_real_executable_comes_back_as_the_same_object():
    compiled = jax.jit(lambda x: x * 2).lower(jnp.ones((4,), jnp.float32)).compile()
    cache = CompiledSteps(max_entries=2)
    cache.put(("double", (4,)), compiled)
    again = cache.get(("double", (4,)))
    assert again is compiled
    assert again(jnp.arange(4, dtype=jnp.float32)).tolist() == [0.0, 2.0, 4.0, 6.0]


# ------------------------------------------------------------------- compiled_peak


def test_compiled_peak_of_a_real_cpu_step():
    x = jnp.ones((8, 16), jnp.float32)  # 512 bytes in, 8 * 32 * 4 = 1,024 bytes out
    w = jnp.ones((16, 32), jnp.float32)  # 2,048 bytes in
    compiled = jax.jit(lambda x, w: jnp.tanh(x @ w)).lower(x, w).compile()
    figures = compiled_peak(compiled)
    assert figures is not None
    assert set(figures) == {"peak", "xla_peak", "argument", "output", "alias", "temp"}
    assert all(isinstance(v, int) and v >= 0 for v in figures.values()), figures
    assert figures["argument"] == 512 + 2048 and figures["output"] == 1024, figures
    total = figures["argument"] + figures["output"] - figures["alias"] + figures["temp"]
    assert figures["peak"] == max(figures["xla_peak"], total), figures


class _NoAnalysis:
    def memory_analysis(self):
        raise NotImplementedError("Unimplemented: memory analysis on this backend")


class _NoneAnalysis:
    def memory_analysis(self):
        return None


@pytest.mark.parametrize("executable", [_NoAnalysis(), _NoneAnalysis(), object()])
def test_compiled_peak_is_none_without_figures(executable):
    assert compiled_peak(executable) is None


# -------------------------------------------------------------- persistent cache


_CACHE_OPTIONS = (
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_persistent_cache_min_entry_size_bytes",
)


@pytest.fixture
def restored_jax_config():
    """This process's persistent-cache options, put back after the test."""
    saved = {name: getattr(jax.config, name) for name in _CACHE_OPTIONS}
    yield
    for name, value in saved.items():
        jax.config.update(name, value)


@pytest.mark.usefixtures("restored_jax_config")
def test_configure_points_jax_at_the_data_directory(tmp_path):
    data_dir = tmp_path / "not" / "yet"  # missing parents are created too
    cache_dir = configure_persistent_cache(data_dir)
    assert cache_dir == data_dir / "jax-cache" and cache_dir.is_dir()
    assert jax.config.jax_compilation_cache_dir == str(cache_dir)
    assert jax.config.jax_persistent_cache_min_compile_time_secs == PERSISTENT_MIN_COMPILE_S
    assert PERSISTENT_MIN_COMPILE_S == 0.1
    assert jax.config.jax_persistent_cache_min_entry_size_bytes == 0
    assert configure_persistent_cache(data_dir) == cache_dir  # again: an existing folder


# A program that takes well over 0.1 s to compile on CPU (~1 s on a 2-core host), so it
# is written to disk; a fresh process compiling it again reads it from there.
_COMPILE_IN_A_FRESH_PROCESS = """
import json, sys
from pathlib import Path
import jax, jax.numpy as jnp
import jax.monitoring
from app.runtime.compile_cache import configure_persistent_cache

events = []
jax.monitoring.register_event_listener(lambda name, **_: events.append(name))
cache_dir = configure_persistent_cache(Path(sys.argv[1]))

def f(x):
    for i in range(60):
        x = jnp.sin(x @ x.T) + i
    return x

jax.jit(f).lower(jnp.ones((8, 8), jnp.float32)).compile()
print(json.dumps({
    "hits": events.count("/jax/compilation_cache/cache_hits"),
    "misses": events.count("/jax/compilation_cache/cache_misses"),
    "entries": sorted(p.name for p in cache_dir.iterdir()),
}))
"""


def _compile_in_a_fresh_process(data_dir) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _COMPILE_IN_A_FRESH_PROCESS, str(data_dir)],
        cwd=PROJECT_ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_restarted_process_compiles_a_known_program_from_disk(tmp_path):
    first = _compile_in_a_fresh_process(tmp_path)
    assert (first["misses"], first["hits"]) == (1, 0), first
    assert first["entries"], first  # written under data_dir / "jax-cache"
    second = _compile_in_a_fresh_process(tmp_path)
    assert (second["misses"], second["hits"]) == (0, 1), second
    assert second["entries"] == first["entries"], second  # read, nothing new written
