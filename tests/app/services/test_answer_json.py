"""Answers as JSON bytes from their classes: stored JSON placed as it is, and templates
whose members (names, order, omissions) are the class's own."""

from __future__ import annotations

import orjson
import pytest

from app.services.answer_json import INT, NULL, TEXT, dumps, stored, template
from datarax.answers.jobs import HistoryPoint, PushResult
from datarax.answers.metrics import ReduceAnswer


def test_stored_json_is_written_as_it_is():
    answer = ReduceAnswer(reduced=stored('{"loss":1.25,"n":[1,2]}'), num_devices=4)
    assert dumps(answer) == b'{"reduced":{"loss":1.25,"n":[1,2]},"num_devices":4}'


def test_a_template_is_the_class_json_with_holes_in_field_order():
    row = template(
        HistoryPoint(step=INT, reduced=TEXT, received_at=TEXT, complete=True, sources=INT)
    )
    assert row == (
        b'{"step":%d,"reduced":%s,"received_at":%s,"complete":true,"sources":%d}'
    )  # omitted members that are None are left out, as to_json leaves them
    text = row % (3, b'{"loss":1.0}', b'"2026-12-01T08:00:00Z"', 1)
    point = HistoryPoint.from_json(orjson.loads(text))
    assert dumps(point) == text


def test_a_constant_holding_a_percent_sign_is_refused():
    with pytest.raises(ValueError, match="%"):
        template(ReduceAnswer(reduced={"100%": 1.0}, num_devices=INT))


def test_null_keeps_an_omitted_member_present():
    answer = PushResult(
        job="j", step=1, source="a", sources=2, complete=False, reduced=None,
        received_at="t", num_devices=1, missing_sources=None,
    )  # fmt: skip
    assert orjson.loads(dumps(answer))["warnings"] == []  # warnings: [] by default
    point = HistoryPoint(
        step=1, reduced=None, received_at="t", complete=False, sources=2,
        received_sources=["a"], missing_sources=NULL,
    )  # fmt: skip
    sent = orjson.loads(dumps(point))
    assert "missing_sources" in sent and sent["missing_sources"] is None
    # read back, null is None: the parsed row leaves the member out
    assert "missing_sources" not in HistoryPoint.from_json(sent)
