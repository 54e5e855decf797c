"""Spread blocks (app.storage.spreads): the extremes of every block, with their device
and step, whatever order and grouping the steps are written in."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from app.storage.db import SQLiteConnection
from app.storage.migrations import SCHEMA
from app.storage.rollups import FANOUT_BITS, LEVELS
from app.storage.spreads import spread_blocks, spreads_between, write_spreads


def _conn() -> SQLiteConnection:
    conn = sqlite3.connect(":memory:")
    conn.executescript(SCHEMA)
    return SQLiteConnection(conn)


def _spread(low: float, low_device: int, high: float, high_device: int) -> dict:
    return {"m": {"min": low, "max": high, "min_device": low_device, "max_device": high_device}}


@pytest.mark.parametrize("chunks", [1, 3, 7])
def test_blocks_hold_the_extremes_in_any_write_order(chunks):
    rng = np.random.default_rng(chunks)
    steps = rng.permutation(600)
    lows = rng.integers(-5, 5, size=600).astype(float)  # ties across steps
    highs = lows + rng.integers(0, 5, size=600)
    devices = rng.integers(0, 64, size=(600, 2))
    conn = _conn()
    for part in np.array_split(np.arange(600), chunks):
        write_spreads(
            conn,
            "j",
            [
                (
                    int(steps[i]),
                    _spread(
                        float(lows[i]), int(devices[i, 0]), float(highs[i]), int(devices[i, 1])
                    ),
                )
                for i in part
            ],
        )
    by_step = {int(steps[i]): i for i in range(600)}
    assert len(spreads_between(conn, "j", 0, 599)) == 600
    for level in LEVELS:
        size = 1 << (FANOUT_BITS * level)
        rows = spread_blocks(conn, "j", level, 0, 599 // size)
        assert len(rows) == -(-600 // size)
        for metric, block, lo, lo_dev, lo_step, hi, hi_dev, hi_step in rows:
            members = [by_step[s] for s in range(block * size, min(600, (block + 1) * size))]
            assert metric == "m"
            assert lo == min(lows[i] for i in members)
            assert hi == max(highs[i] for i in members)
            i, j = by_step[lo_step], by_step[hi_step]
            assert (lows[i], devices[i, 0]) == (lo, lo_dev)
            assert (highs[j], devices[j, 1]) == (hi, hi_dev)
            if chunks == 1:  # one write: ties go to the lowest step
                assert lo_step == min(block * size + k for k in range(size)
                                      if block * size + k in by_step
                                      and lows[by_step[block * size + k]] == lo)  # fmt: skip
