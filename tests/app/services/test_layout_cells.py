"""Cells of a layout picture: the device grid, summary blocks, and slice colours."""

from __future__ import annotations

from collections import Counter

from app.services.layout_cells import (
    MAX_BLOCKS,
    MAX_LEGEND,
    MIXED,
    WRAP,
    Colours,
    block_cells,
    device_cells,
    grid_row_labels,
    grid_shape,
    plural,
    ramp,
)


def test_one_axis_wraps_and_more_axes_flatten_into_rows():
    assert grid_shape([WRAP]) == (1, WRAP, False)
    assert grid_shape([WRAP + 4]) == (2, WRAP, True)
    assert grid_shape([2, 3, 4]) == (6, 4, False)


def test_rows_are_labelled_with_their_leading_coordinates():
    assert grid_row_labels([2, 3, 4], False, 6) == ["0,0", "0,1", "0,2", "1,0", "1,1", "1,2"]
    assert grid_row_labels([20], True, 2) == ["0", "1"]
    assert grid_row_labels([8], False, 1) == [""]


def test_few_slices_get_a_colour_each_and_a_block_of_several_is_mixed():
    keys = [(0, 4), (4, 8), (0, 4)]  # the first slice has two replicas
    colours = Colours(Counter(keys), 0, 8)
    assert colours.categorical
    assert colours.of([(0, 4)]) == colours.of([(0, 4), (0, 4)])
    assert colours.of([(0, 4)]) != colours.of([(4, 8)])
    assert colours.of([(0, 4), (4, 8)]) == MIXED


def test_many_slices_follow_a_ramp_over_their_start_rows():
    keys = [(i, i + 1) for i in range(MAX_LEGEND + 1)]
    colours = Colours(Counter(keys), 0, len(keys))
    assert not colours.categorical
    assert colours.of([keys[0]]) == ramp(0.0)
    assert colours.of([keys[-1]]) == ramp(1.0)
    assert colours.of(keys[:2]) == ramp(0.0)  # a block takes its first slice's colour


def test_device_cells_fill_rows_and_name_slice_and_host():
    shards = [
        {"device": d, "coords": {"data": d}, "index": [[d, d + 1]], "slice": 0, "host": d // 2}
        for d in range(4)
    ]
    colours = Colours(Counter((d, d + 1) for d in range(4)), 0, 4)
    cells = device_cells(shards, [1, 2, 3], ["data"], colours, 2)
    assert [(c.row, c.col) for c in cells] == [(0, 0), (0, 1), (1, 0)]
    assert cells[0].lines == ["1", "(1)", "s0 h0"]
    assert "batch row 1 " in cells[0].tip
    assert cells[0].host == (0, 0) and cells[2].host == (0, 1)


def test_more_groups_than_blocks_share_blocks_that_link_to_their_devices():
    slices = 2 * MAX_BLOCKS
    shards = [{"device": d, "slice": d // 4} for d in range(4 * slices)]
    positions = list(range(len(shards)))
    colours = Colours(Counter([None]), 0, 0)
    how, cells = block_cells(
        shards, positions, [None] * len(shards), ["data"], [len(shards)], colours, {}
    )
    assert how == "2 slices each"
    assert len(cells) == MAX_BLOCKS
    assert cells[0].href == "?slice=0-1" and cells[-1].href == f"?slice={slices - 2}-{slices - 1}"
    assert cells[0].lines == ["slices 0\u20131", plural(8, "device"), "whole batch"]


def test_plural():
    assert plural(1, "device") == "1 device"
    assert plural(65_536, "device") == "65,536 devices"
    assert plural(2, "process", "processes") == "2 processes"


def test_batch_rows_read_as_a_reader_says_them():
    from app.services.layout_cells import batch_rows

    assert batch_rows(0, 202) == "batch rows 0-201"
    assert batch_rows(7, 8) == "batch row 7"
    assert batch_rows(64512, 65536) == "batch rows 64512-65535"
    assert batch_rows(None, None) == "whole batch"
