"""The layout SVG: device cells or host/slice blocks, link classes, colours, bounded size."""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from app.schemas.meshes import MeshPlanRequest
from app.services.layout_svg import render_layout_svg
from app.services.meshes import plan_request
from app.services.plans import abstract_devices, render_plan
from datarax.distributed.planning import resolve_axes

NS = "{http://www.w3.org/2000/svg}"
SLICE_COLOUR = "#c62828"


def _plain_plan(body: dict, n: int) -> dict:
    request = plan_request(MeshPlanRequest.model_validate({**body, "num_devices": n}))
    axes = resolve_axes(request.axes, n, exact=True)
    rendered = render_plan(request, axes, abstract_devices(axes), plan_id="m_x", created_at="t")
    return json.loads(rendered.body)


def _hardware_plan(slices: int, hosts_per_slice: int, chips_per_host: int, batch: int) -> dict:
    """A synthetic hardware plan: data over slices (dcn), fsdp inside a slice (ici).

    Batch dim 0 is split over ``data`` only, so each slice holds one contiguous batch range.
    """
    per_slice = hosts_per_slice * chips_per_host
    n = slices * per_slice
    p = np.arange(n)
    data, fsdp = p // per_slice, p % per_slice
    rows = batch // slices
    start = data * rows
    host = p // chips_per_host
    local = p % chips_per_host
    table = np.stack([p, data, fsdp, start, start + rows, host, local], axis=1).tolist()
    shards = [
        {
            "device": d,
            "process_index": h,
            "coords": {"data": a, "fsdp": f},
            "index": [[s, e]],
            "replica": f,
            "slice": a,
            "host": h,
            "physical": [loc % 2, loc // 2, 0],
            "core": 0,
        }
        for d, a, f, s, e, h, loc in table
    ]
    return {
        "id": "m_hw",
        "name": "hardware <plan>",
        "live": False,
        "platform": "tpu",
        "axes": {"data": slices, "fsdp": per_slice},
        "total_devices": n,
        "axes_detail": [
            {
                "name": "data",
                "size": slices,
                "ici": 1,
                "dcn": slices,
                "link": "dcn",
                "bytes_per_s": 2.5e10,
            },
            {
                "name": "fsdp",
                "size": per_slice,
                "ici": per_slice,
                "dcn": 1,
                "link": "ici",
                "bytes_per_s": 4.5e10,
            },
        ],  # fmt: skip
        "batch": {"shape": [batch], "spec": ["data"], "shard_shape": [rows]},
        "shards": shards,
    }


def _parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{NS}svg"
    assert root.get("viewBox") == f"0 0 {root.get('width')} {root.get('height')}"
    return root


def _box(text: ET.Element) -> tuple[float, float, float, float]:
    """The (left, top, right, bottom) of a monospace <text> from its emitted coordinates."""
    size = float(text.get("font-size"))
    width = len(text.text or "") * size * 0.6
    x, y = float(text.get("x")), float(text.get("y"))
    left = {"start": x, "middle": x - width / 2, "end": x - width}[text.get("text-anchor")]
    return left, y - 0.8 * size, left + width, y + 0.25 * size


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _assert_free_text_apart(root: ET.Element) -> None:
    """Texts outside cells (header, axis labels, note, legend) neither overlap nor spill."""
    texts = list(root.findall(f"{NS}text"))
    boxes = [_box(t) for t in texts]
    width = float(root.get("width"))
    for i, a in enumerate(boxes):
        assert a[0] >= 0 and a[2] <= width, texts[i].text
        for j in range(i + 1, len(boxes)):
            assert not _overlap(a, boxes[j]), (texts[i].text, texts[j].text)


def _cells(root: ET.Element) -> list[ET.Element]:
    return root.findall(f"{NS}g")


def _lines(root: ET.Element, colour: str) -> list[ET.Element]:
    return [line for line in root.iter(f"{NS}line") if line.get("stroke") == colour]


def test_small_plain_plan_draws_every_device_with_a_colour_per_slice():
    plan = _plain_plan({"axes": {"data": 2, "model": 4}, "batch_shape": [16, 6]}, 8)
    svg = render_layout_svg(plan)
    root = _parse(svg)
    cells = _cells(root)
    assert [g.find(f"{NS}text").text for g in cells] == [str(i) for i in range(8)]
    fills = [g.find(f"{NS}rect").get("fill") for g in cells]
    assert len(set(fills[:4])) == 1 and len(set(fills[4:])) == 1 and fills[0] != fills[4]
    assert "columns \u2192 model=4" in svg and "rows \u2193 data=2" in svg
    assert "[0, 8): 4 device(s)" in svg and "[8, 16): 4 device(s)" in svg
    assert "(ici)" not in svg and "linearGradient" not in svg and "<line" not in svg
    _assert_free_text_apart(root)


def test_hardware_plan_outlines_slices_and_hosts_and_names_links():
    plan = _hardware_plan(slices=2, hosts_per_slice=2, chips_per_host=4, batch=32)
    svg = render_layout_svg(plan)
    root = _parse(svg)
    assert "data=2 (dcn)" in svg and "fsdp=8 (ici)" in svg
    assert "hardware &lt;plan&gt;" in svg
    cells = _cells(root)
    assert len(cells) == 16
    assert [t.text for t in cells[5].findall(f"{NS}text")] == ["5", "(0,5)", "s0 h1"]
    assert "physical [1, 0, 0]" in cells[5].find(f"{NS}title").text
    # Grid 2 x 8: the slice boundary runs between the rows (one segment per column), the
    # host boundary between columns 3 and 4 of each row.
    slice_lines = _lines(root, SLICE_COLOUR)
    assert len(slice_lines) == 8 + 1  # + the legend sample
    assert {line.get("y1") == line.get("y2") for line in slice_lines} == {True}
    host_lines = [line for line in _lines(root, "#424242") if line.get("stroke-dasharray")]
    vertical = [line for line in host_lines if line.get("x1") == line.get("x2")]
    assert len(vertical) == 2
    rects = [g.find(f"{NS}rect") for g in cells]
    x3 = float(rects[3].get("x")) + float(rects[3].get("width"))
    x4 = float(rects[4].get("x"))
    assert all(x3 < float(line.get("x1")) < x4 for line in vertical)
    _assert_free_text_apart(root)


def test_many_slices_use_a_ramp_replicas_share_a_colour():
    plan = _plain_plan({"axes": {"data": 64, "model": 2}, "batch_shape": [128]}, 128)
    svg = render_layout_svg(plan)
    root = _parse(svg)
    assert "linearGradient" in svg and "continuous ramp" in svg and "64 distinct" in svg
    fills = [g.find(f"{NS}rect").get("fill") for g in _cells(root)]
    assert len(fills) == 128
    assert all(fills[2 * i] == fills[2 * i + 1] for i in range(64))  # model replicas
    assert len(set(fills)) == 64
    _assert_free_text_apart(root)


def _timed(plan: dict) -> tuple[str, float]:
    start = time.perf_counter()
    svg = render_layout_svg(plan)
    return svg, time.perf_counter() - start


def _assert_bounded(root: ET.Element, svg: str, seconds: float) -> None:
    assert len(svg.encode()) < 2_000_000
    assert float(root.get("width")) < 4000 and float(root.get("height")) < 4000
    del seconds  # timed for the report only: make bench measures speed, tests do not


def test_65536_device_hardware_plan_draws_slices_as_blocks():
    plan = _hardware_plan(slices=256, hosts_per_slice=64, chips_per_host=4, batch=65536)
    svg, seconds = _timed(plan)
    root = _parse(svg)
    _assert_bounded(root, svg, seconds)
    blocks = _cells(root)
    assert len(blocks) == 256  # 16,384 hosts are too many: one block per slice
    assert "65536 devices drawn as 256 blocks (one per slice)" in svg
    labels = [[t.text for t in g.findall(f"{NS}text")] for g in blocks]
    assert labels[0] == ["slice 0", "256 dev/64h", "[0,256)"]
    assert labels[255] == ["slice 255", "256 dev/64h", "[65280,65536)"]
    fills = [g.find(f"{NS}rect").get("fill") for g in blocks]
    assert fills[0] != fills[255] and len(set(fills)) > 64  # a ramp, not a few repeats
    assert "linearGradient" in svg and "256 distinct" in svg
    # Every block is its own slice: boundaries between all 16 x 16 neighbours.
    assert len(_lines(root, SLICE_COLOUR)) == 2 * 16 * 15 + 1
    assert "data=256 (dcn)" in svg and "fsdp=256 (ici)" in svg
    _assert_free_text_apart(root)


@pytest.mark.parametrize(
    ("axes", "blocks", "unit"),
    [({"data": 65536}, 1024, "run of 64 devices"), ({"data": 256, "model": 256}, 256, "row")],
    ids=["1d", "2d"],
)
def test_65536_device_plain_plan_is_bounded(axes, blocks, unit):
    plan = _plain_plan({"axes": axes, "batch_shape": [65536]}, 65536)
    svg, seconds = _timed(plan)
    root = _parse(svg)
    _assert_bounded(root, svg, seconds)
    assert len(_cells(root)) == blocks
    assert f"65536 devices drawn as {blocks} blocks (one per {unit}" in svg
    _assert_free_text_apart(root)


def test_hosts_as_blocks_when_few_enough():
    plan = _hardware_plan(slices=2, hosts_per_slice=256, chips_per_host=4, batch=64)
    root = _parse(svg := render_layout_svg(plan))
    blocks = _cells(root)
    assert len(blocks) == 512 and "(one per host)" in svg
    assert [t.text for t in blocks[300].findall(f"{NS}text")] == ["s1 h300", "4 dev", "[32,64)"]
    # Two batch slices: categorical colours, one per slice.
    fills = [g.find(f"{NS}rect").get("fill") for g in blocks]
    assert len(set(fills[:256])) == 1 and len(set(fills[256:])) == 1 and fills[0] != fills[256]
    assert "linearGradient" not in svg
    _assert_free_text_apart(root)
