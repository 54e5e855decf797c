"""Digests of pushed points: one point's equals its digest in any batch, and any change
of content or options changes it."""

from __future__ import annotations

import numpy as np

from app.services.jobs.decode import PointInput
from app.services.jobs.digests import part_signature, point_digest, point_digests


def _point(loss, **options) -> PointInput:
    return PointInput(
        step=1,
        metrics={"loss": np.asarray(loss), "lr": np.float64(0.1)},
        reduce=options.get("reduce", {}),
        weights=options.get("weights"),
        nan_policy=options.get("nan_policy", "propagate"),
    )


def test_a_point_digest_is_its_digest_in_a_batch():
    losses = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    columns = {"loss": losses, "lr": np.full(3, 0.1)}
    batch = point_digests(["loss", "lr"], columns, None, {}, "propagate")
    assert [point_digest(_point(row)) for row in losses] == batch
    assert all(d.startswith("r") and len(d) == 17 for d in batch)


def test_content_and_options_change_the_digest():
    base = point_digest(_point([1.0, 2.0]))
    changed = [
        _point([1.0, 2.5]),
        _point(np.array([1.0, 2.0], np.float32)),
        _point([1.0, 2.0], reduce={"loss": "sum"}),
        _point([1.0, 2.0], nan_policy="omit"),
        _point([1.0, 2.0], weights=np.array([1.0, 1.0])),
    ]
    assert base == point_digest(_point([1.0, 2.0]))
    assert all(point_digest(p) != base for p in changed)
    # reduce "mean" is the default: naming it is the same content.
    assert point_digest(_point([1.0, 2.0], reduce={"loss": "mean"})) == base


def test_a_part_signature_names_shapes_and_options():
    metrics = {"loss": np.zeros((4, 3)), "lr": np.float64(1.0)}
    text = part_signature(metrics, {"loss": "max"}, "omit")
    assert text == (
        '{"metrics":{"loss":[3],"lr":null},"nan_policy":"omit","reduce":{"loss":"max","lr":"mean"}}'
    )
