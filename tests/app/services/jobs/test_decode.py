"""Decoding a pushed body into one JobBatch: every shape, each validated once, with the
same points and errors whichever form (plain, model, columns) took it."""

from __future__ import annotations

import io

import numpy as np
import orjson
import pytest

from app.core.errors import ServiceError
from app.schemas.jobs import is_source_name
from app.services.jobs.decode import BatchColumns, decode_batch, decode_npz_batch, decode_point
from app.services.jobs.limits import PointLimits


def _single(body: dict, **query) -> list:
    options = {"step": None, "reduce": None, "nan_policy": None, "source": None, "sources": None}
    batch = decode_point(
        orjson.dumps(body), "application/json", None, max_bytes=1 << 20, **{**options, **query}
    )
    assert batch.single and batch.columns is None
    return batch.points


def test_a_plain_point_and_one_the_model_validates_decode_alike():
    plain = {"metrics": {"loss": [1.0, 3.0], "lr": 0.5}, "step": 4, "source": "h-0", "sources": 2}
    # A step written 4.0 is not the plain form: the model takes it (JsonInt) and coerces it.
    (a,) = _single(plain)
    (b,) = _single({**plain, "step": 4.0})
    for point in (a, b):
        assert (point.step, point.source, point.sources, point.nan_policy) == (
            4,
            "h-0",
            2,
            "propagate",
        )
        assert point.metrics["loss"].tolist() == [1.0, 3.0] and point.metrics["lr"] == 0.5
        assert point.metrics["loss"].dtype == np.float64


@pytest.mark.parametrize("source", ["", "host-0", "a:b.c_d", "x" * 128])
def test_valid_sources_take_the_plain_form(source):
    (point,) = _single({"metrics": {"loss": [1.0]}, "step": 0, "source": source})
    assert point.source == source and is_source_name(source)


@pytest.mark.parametrize("source", ["x" * 129, "host 0", "h\u00e9", "a\n", "a/b"])
def test_invalid_sources_are_refused_by_the_one_rule(source):
    assert not is_source_name(source)
    with pytest.raises(ServiceError) as err:
        _single({"metrics": {"loss": [1.0]}, "step": 0, "source": source})
    assert err.value.code == "validation_error"


def test_the_usual_json_batch_is_kept_as_columns():
    body = {
        "points": [{"step": s, "metrics": {"loss": [1.0, float(s)], "lr": 0.1}} for s in range(3)]
    }
    batch = decode_batch(orjson.dumps({**body, "source": "h1", "sources": 2}))
    assert isinstance(batch.columns, BatchColumns) and not batch.points and len(batch) == 3
    assert batch.columns.arrays["loss"].shape == (3, 2) and batch.columns.plain()
    assert (batch.columns.source, batch.columns.sources) == ("h1", 2)
    # Its points are exactly the points the point-by-point path decodes.
    mixed = {"points": [*body["points"], {"step": 9, "metrics": {"loss": [1, 2]}}]}
    one_by_one = decode_batch(orjson.dumps(mixed)).points
    for got, want in zip(batch.columns.points(), one_by_one, strict=False):
        assert got.step == want.step and got.index == want.index
        for name in want.metrics:
            assert got.metrics[name].dtype == want.metrics[name].dtype
            assert np.array_equal(got.metrics[name], want.metrics[name])


def test_batch_defaults_apply_unless_a_point_gives_its_own():
    body = {
        "points": [
            {"step": 1, "metrics": {"x": [1.0]}, "source": "own"},
            {"step": 2, "metrics": {"x": [1.0]}, "reduce": {"x": "sum"}},
        ],
        "source": "default",
        "sources": 3,
    }
    points = decode_batch(orjson.dumps(body)).points
    assert [(p.source, p.sources) for p in points] == [("own", 3), ("default", 3)]


def test_a_refused_batch_point_is_named():
    body = {
        "points": [
            {"step": 1, "metrics": {"x": [1.0]}},
            {"step": 2, "metrics": {"x": [[1], [2, 3]]}},
        ]
    }
    with pytest.raises(ServiceError) as err:
        decode_batch(orjson.dumps(body))
    assert err.value.detail.startswith("points[1]: ")


def test_the_caps_hold_on_the_columnar_path_too():
    body = {
        "points": [{"step": s, "metrics": {f"m{k}": [1.0] for k in range(5)}} for s in range(2)]
    }
    with pytest.raises(ServiceError) as err:
        decode_batch(orjson.dumps(body), PointLimits(max_metrics=4))
    assert err.value.code == "too_many_metrics" and "points[0]" in err.value.detail


def _npz(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def test_an_npz_batch_is_columns_with_its_query_options():
    body = _npz(_step=np.array([3.0, 4.0]), loss=np.ones((2, 4)), _weights=np.ones((2, 4)))
    batch = decode_npz_batch(
        body, max_bytes=1 << 20, reduce="loss:sum", nan_policy="omit", source="h", sources=None
    )
    columns = batch.columns
    assert columns is not None and columns.steps == [3, 4] and not columns.plain()
    assert (columns.reduce, columns.nan_policy, columns.source, columns.sources) == (
        {"loss": "sum"},
        "omit",
        "h",
        1,
    )
    assert columns.points()[1].weights.tolist() == [1.0] * 4


def test_an_npz_single_push_needs_its_step():
    with pytest.raises(ServiceError) as err:
        decode_point(
            _npz(loss=np.ones(2)),
            "application/x-npz",
            None,
            max_bytes=1 << 20,
            step=None,
            reduce=None,
            nan_policy=None,
            source=None,
            sources=None,
        )
    assert err.value.code == "validation_error" and "?step=N" in err.value.detail


def test_other_media_are_unsupported():
    with pytest.raises(ServiceError) as err:
        decode_point(
            b"x",
            "text/plain",
            "text/plain",
            max_bytes=1,
            step=0,
            reduce=None,
            nan_policy=None,
            source=None,
            sources=None,
        )
    assert err.value.code == "unsupported_media_type"


def test_a_plain_body_is_never_validated_by_the_models(monkeypatch):
    from app.services.jobs import decode

    def refuse(*_args):
        raise AssertionError("validated a second time")

    monkeypatch.setattr(decode, "validate_model", refuse)
    (point,) = _single({"metrics": {"loss": [1.0]}, "step": 1, "source": "h-0", "sources": 2})
    assert point.sources == 2
    mixed = {"points": [{"step": 1, "metrics": {"x": [1]}}, {"step": 2, "metrics": {"y": 2}}]}
    assert [p.step for p in decode_batch(orjson.dumps(mixed)).points] == [1, 2]
    with pytest.raises(AssertionError):  # not the plain form: the model decides
        _single({"metrics": {"loss": [1.0]}, "step": "1"})
