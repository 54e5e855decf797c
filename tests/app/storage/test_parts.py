"""Multi-source parts as stored: source names and order, coverage blocks. (The merge of
completed steps is the jobs service's: tests/app/services/jobs/test_parts.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from app.storage import parts as store_parts


def test_missing_sources_are_named_when_the_names_tell_them():
    assert store_parts.missing_sources(["host-0", "host-2"], 4) == ["host-1", "host-3"]
    assert store_parts.missing_sources(["0"], 2) == ["1"]
    assert store_parts.missing_sources(["a", "b"], 3) is None
    assert store_parts.missing_sources(["h-0", "g-1"], 3) is None
    assert sorted(["host-10", "host-2"], key=store_parts.source_order) == ["host-2", "host-10"]


@pytest.mark.parametrize(
    ("received", "sources"),
    [
        (["h0", "h00"], 3),  # both read as index 0: two names, one index
        (["h00"], 3),
        (["h1", "h01", "h001"], 5),
        (["host-07"], 8),
        (["0", "00"], 3),
        (["h3"], 3),  # an index not below sources
    ],
    ids=["h0-h00", "h00", "h1-h01-h001", "leading-zero", "0-00", "out-of-range"],
)
def test_missing_sources_are_unknown_when_names_are_not_canonical(received, sources):
    assert store_parts.missing_sources(received, sources) is None


def test_missing_sources_always_count_what_is_missing():
    rng = np.random.default_rng(3)
    for _ in range(500):
        sources = int(rng.integers(1, 12))
        names = [f"h{int(i)}" for i in rng.integers(0, 12, size=int(rng.integers(1, 6)))]
        names += [f"h0{int(i)}" for i in rng.integers(0, 3, size=int(rng.integers(0, 2)))]
        received = list(dict.fromkeys(names))  # distinct, as stored
        missing = store_parts.missing_sources(received, sources)
        if missing is not None:
            assert len(missing) == sources - len(received), (received, sources, missing)
            assert not set(missing) & set(received)


@pytest.mark.parametrize(
    "steps",
    [[0], [4095], [0, 1, 2, 4095], list(range(2047)), list(range(2048)), list(range(4096))],
    ids=["first", "last", "edges", "sparse-most", "dense-least", "full"],
)
def test_coverage_blocks_round_trip_and_are_stored_sparse_when_smaller(steps):
    counts = np.zeros(4096, dtype="<u2")
    counts[steps] = np.arange(1, len(steps) + 1) % 65535 + 1
    blob = store_parts.encode_coverage(counts)
    assert np.array_equal(store_parts.decode_coverage(blob), counts)
    assert len(blob) == min(4 * len(steps), 8192) if len(steps) < 2048 else len(blob) == 8192
    # A dense block written before the sparse encoding reads unchanged.
    assert np.array_equal(store_parts.decode_coverage(counts.tobytes()), counts)
