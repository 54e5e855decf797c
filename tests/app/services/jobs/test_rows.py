"""Rows to store: the columnar path gives exactly the rows of the point-by-point path."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest

from app.core.errors import ServiceError
from app.services.jobs.decode import JobBatch, PointInput, decode_batch
from app.services.jobs.rows import build_items, rows_of
from app.storage.part_blobs import decode_part


def _batch_body(count: int, **options) -> bytes:
    rng = np.random.default_rng(1)
    points = [
        {"step": s, "metrics": {"loss": rng.normal(size=4).tolist(), "lr": 0.25}}
        for s in range(count)
    ]
    return orjson.dumps({"points": points, **options})


def test_columns_store_what_the_points_would():
    batch = decode_batch(_batch_body(5))
    columns = rows_of(batch).columns
    assert columns is not None
    items = build_items(batch.columns.points())
    assert columns.steps == [i.step for i in items]
    assert columns.digests == [i.digest for i in items]
    assert [json.loads(t) for t in columns.reduced] == [json.loads(i.reduced) for i in items]
    assert columns.reduced == [i.reduced for i in items]
    assert columns.items()[2].values == pytest.approx(items[2].values)


def test_parts_as_columns_are_one_segment_with_the_points_signature():
    batch = decode_batch(_batch_body(3, source="h-1", sources=2))
    segment = rows_of(batch).parts
    assert segment is not None and segment.steps == [0, 1, 2] and segment.num_devices == 4
    items = build_items(batch.columns.points())
    assert {i.signature for i in items} == {segment.signature}
    for k, item in enumerate(items):
        stored = decode_part(item.arrays)
        assert np.array_equal(stored["loss"], segment.columns["loss"][k])


def test_a_single_point_is_reduced_alone():
    point = PointInput(1, {"x": np.array([1.0, 3.0])}, {"x": "max"}, None, "propagate")
    (item,) = rows_of(JobBatch(points=[point], single=True)).items
    assert json.loads(item.reduced) == {"x": 3.0} and item.values == {"x": 3.0}
    assert item.num_devices == 2 and item.digest


def test_a_reduce_error_names_its_point():
    good = PointInput(1, {"x": np.array([1.0])}, {}, None, "propagate", index=0)
    bad = PointInput(2, {"x": np.array([1.0])}, {"x": "median"}, None, "propagate", index=1)
    with pytest.raises(ServiceError) as err:
        build_items([good, bad])
    assert err.value.detail.startswith("points[1]: ")


def test_a_part_may_not_name_a_metric_weights():
    part = PointInput(1, {"_weights": np.array([1.0])}, {}, None, "propagate", "h", 2)
    with pytest.raises(ServiceError) as err:
        build_items([part])
    assert err.value.code == "validation_error"
