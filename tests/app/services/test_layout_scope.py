"""Scopes of a layout picture: parsing the query filters, selecting devices, naming them."""

from __future__ import annotations

import pytest

from app.core.errors import ServiceError
from app.services.layout_scope import (
    parse_scope,
    scope_query,
    scope_text,
    select_positions,
    span_text,
)

# Two slices of two hosts of two devices each, in mesh order.
SHARDS = [{"device": d, "slice": d // 4, "host": d // 2, "process_index": d // 2} for d in range(8)]


def test_a_scope_parses_numbers_and_ranges_and_leaves_out_empty_values():
    assert parse_scope({"slice": "3", "positions": "0-1023", "host": "", "process": None}) == {
        "slice": (3, 3),
        "positions": (0, 1023),
    }


@pytest.mark.parametrize(
    ("params", "name"),
    [
        ({"slice": "abc"}, "slice"),
        ({"host": "3-1"}, "host"),
        ({"positions": "-1"}, "positions"),
        ({"process": "1-2-3"}, "process"),
        ({"slice": "1", "positions": "9999999999"}, "positions"),
    ],
    ids=["not-a-number", "backwards", "negative", "two-dashes", "too-long"],
)
def test_bad_scopes_name_the_parameter(params, name):
    with pytest.raises(ServiceError) as err:
        parse_scope(params)
    assert err.value.code == "validation_error"
    assert err.value.extra["errors"][0]["loc"] == ["query", name]


def test_a_scope_query_round_trips_through_parse_scope():
    scope = {"positions": (4, 7), "slice": (1, 1)}
    query = scope_query(scope)
    assert query == "slice=1&positions=4-7"  # the filters' fixed order, not the dict's
    assert parse_scope(dict(part.split("=") for part in query.split("&"))) == scope


def test_filters_intersect_and_positions_are_clipped_to_the_plan():
    assert select_positions(SHARDS, {"slice": (1, 1)}) == [4, 5, 6, 7]
    assert select_positions(SHARDS, {"slice": (1, 1), "host": (3, 3)}) == [6, 7]
    assert select_positions(SHARDS, {"positions": (6, 99)}) == [6, 7]
    assert select_positions(SHARDS, {"slice": (2, 5)}) == []


def test_plans_without_hosts_are_all_process_0_and_have_no_slices():
    plain = [{"device": d} for d in range(4)]
    assert select_positions(plain, {"process": (0, 0)}) == [0, 1, 2, 3]
    assert select_positions(plain, {"slice": (0, 0)}) == []


def test_a_scope_is_named_in_words():
    assert scope_text({"slice": (3, 3), "host": (0, 15)}) == "slice 3, hosts 0\u201315"
    assert span_text(2, 2) == "2" and span_text(0, 7) == "0\u20137"
