"""The stored text of reduced points: built from whole columns exactly as one dumps per row."""

from __future__ import annotations

import numpy as np
import orjson

from app.storage.reduced_text import object_texts, scalar_floats


def test_column_texts_are_each_rows_json():
    rng = np.random.default_rng(2)
    columns = [rng.normal(size=50), rng.integers(0, 9, size=50).astype(np.float64)]
    columns[0][[3, 7]] = [np.nan, np.inf]
    names = ["loss", 'we"ird,name\n']
    want = [
        orjson.dumps({n: float(c[i]) for n, c in zip(names, columns, strict=True)}).decode()
        for i in range(50)
    ]
    assert object_texts(names, columns) == want
    assert orjson.loads(want[3])["loss"] is None  # NaN and inf are null
    assert object_texts(names, [np.zeros(0), np.zeros(0)]) == []


def test_scalar_floats_keep_real_numbers_only():
    reduced = {"a": np.float32(1.5), "b": np.int64(2), "c": np.bool_(True), "d": [1.0], "e": 3}
    assert scalar_floats(reduced) == {"a": 1.5, "b": 2.0, "e": 3.0}
