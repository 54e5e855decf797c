"""The layout SVG: device cells or summary blocks, scopes and their links, link classes and
bandwidths, colours, legible text, bounded size."""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from urllib.parse import parse_qsl

import numpy as np
import pytest

from app.core.errors import ServiceError
from app.schemas.meshes import MeshPlanRequest
from app.services.layout_cells import MAX_BLOCKS
from app.services.layout_scope import parse_scope
from app.services.layout_svg import BLOCK_W, MIN_FONT, format_rate, render_layout_svg
from app.services.meshes import plan_request
from app.services.plans import abstract_devices, render_plan
from datarax.plan.layout import resolve_axes

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
    Hosts are numbered across the whole plan, as hardware plans number them.
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
        "slices": slices,
        "hosts": slices * hosts_per_slice,
        "axes_detail": [
            {
                "name": "data",
                "size": slices,
                "ici": 1,
                "dcn": slices,
                "link": "dcn",
                "bytes_per_s": 6.25e9,
            },
            {
                "name": "fsdp",
                "size": per_slice,
                "ici": per_slice,
                "dcn": 1,
                "link": "ici",
                "bytes_per_s": 9e10,
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


def _assert_legible(root: ET.Element) -> None:
    """Every text is at least MIN_FONT px at the picture's natural size, and the text of a
    cell stays inside its cell."""
    for text in root.iter(f"{NS}text"):
        assert float(text.get("font-size")) >= MIN_FONT, text.text
    for group in root.iter(f"{NS}g"):
        rect = group.find(f"{NS}rect")
        left, right = float(rect.get("x")), float(rect.get("x")) + float(rect.get("width"))
        top, bottom = float(rect.get("y")), float(rect.get("y")) + float(rect.get("height"))
        for text in group.findall(f"{NS}text"):
            box = _box(text)
            assert left <= box[0] and box[2] <= right, (text.text, box, left, right)
            assert top <= box[1] and box[3] <= bottom, (text.text, box, top, bottom)


def _cells(root: ET.Element) -> list[ET.Element]:
    """Device cells (direct <g> children) or block cells (each inside its <a> link)."""
    return root.findall(f"{NS}g") + root.findall(f"{NS}a/{NS}g")


def _links(root: ET.Element) -> list[str]:
    return [a.get("href") for a in root.findall(f"{NS}a")]


def _labels(root: ET.Element) -> list[list[str]]:
    return [[t.text for t in g.findall(f"{NS}text")] for g in _cells(root)]


def _lines(root: ET.Element, colour: str) -> list[ET.Element]:
    return [line for line in root.iter(f"{NS}line") if line.get("stroke") == colour]


def _scope(href: str) -> dict[str, tuple[int, int]]:
    assert href.startswith("?"), href
    return parse_scope(dict(parse_qsl(href[1:])))


def _block_devices(label: list[str]) -> int:
    return int(label[1].split()[0].replace(",", ""))


def test_small_plain_plan_draws_every_device_with_a_colour_per_slice():
    plan = _plain_plan({"axes": {"data": 2, "model": 4}, "batch_shape": [16, 6]}, 8)
    svg = render_layout_svg(plan)
    root = _parse(svg)
    cells = _cells(root)
    assert [g.find(f"{NS}text").text for g in cells] == [str(i) for i in range(8)]
    fills = [g.find(f"{NS}rect").get("fill") for g in cells]
    assert len(set(fills[:4])) == 1 and len(set(fills[4:])) == 1 and fills[0] != fills[4]
    assert "columns \u2192 model=4" in svg and "rows \u2193 data=2" in svg
    assert "batch rows 0-7: 4 devices" in svg and "batch rows 8-15: 4 devices" in svg
    assert "8 devices, abstract" in svg and "device(s)" not in svg
    assert "(ici)" not in svg and "linearGradient" not in svg and "<line" not in svg
    assert _links(root) == []  # devices are the last level
    _assert_free_text_apart(root)
    _assert_legible(root)


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
    _assert_legible(root)


@pytest.mark.parametrize(
    ("bytes_per_s", "text"),
    [
        (6.25e9, "6.25 GB/s"),
        (9e10, "90 GB/s"),
        (4.5e10, "45 GB/s"),
        (1.2345e11, "123 GB/s"),
        (999, "999 B/s"),
        (1000, "1 kB/s"),
        (2.5e12, "2.5 TB/s"),
        (1.5e15, "1500 TB/s"),
        (0, "0 B/s"),
    ],
    ids=lambda v: str(v),
)
def test_rates_are_bytes_per_second_with_si_prefixes(bytes_per_s, text):
    assert format_rate(bytes_per_s) == text


def test_the_picture_writes_bandwidth_as_the_tables_do():
    svg = render_layout_svg(_hardware_plan(slices=2, hosts_per_slice=2, chips_per_host=4, batch=32))
    assert "axis data: dcn, ici=1 dcn=2, 6.25 GB/s" in svg
    assert "axis fsdp: ici, ici=8 dcn=1, 90 GB/s" in svg
    assert "e+09" not in svg and "e+10" not in svg and "GiB/s" not in svg


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
    _assert_legible(root)


def _timed(plan: dict, scope=None) -> tuple[str, float]:
    start = time.perf_counter()
    svg = render_layout_svg(plan, scope)
    return svg, time.perf_counter() - start


def _assert_summary_sized(root: ET.Element, svg: str, seconds: float) -> None:
    """A block picture fits a laptop screen at 1:1 (its text is legible unscaled)."""
    assert len(svg.encode()) < 200_000
    assert float(root.get("width")) <= 1240 and float(root.get("height")) <= 1000
    print(f"layout drawn in {seconds:.3f} s")  # measured, not asserted (make bench times it)


def test_65536_device_hardware_plan_opens_as_a_legible_summary():
    plan = _hardware_plan(slices=256, hosts_per_slice=64, chips_per_host=4, batch=65536)
    svg, seconds = _timed(plan)
    root = _parse(svg)
    _assert_summary_sized(root, svg, seconds)
    labels = _labels(root)
    assert len(labels) == MAX_BLOCKS  # 256 slices, 4 to a block
    assert "65,536 devices drawn as 64 blocks (4 slices each); click a block to open it" in svg
    assert labels[0] == ["slices 0\u20133", "1,024 devices", "256 hosts", "batch rows 0-1023"]
    assert labels[-1][0] == "slices 252\u2013255"
    assert labels[-1][-1] == "rows 64512-65535"  # too wide for its block with "batch"
    assert _links(root) == [f"?slice={4 * b}-{4 * b + 3}" for b in range(64)]
    fills = [g.find(f"{NS}rect").get("fill") for g in _cells(root)]
    assert fills[0] != fills[-1] and len(set(fills)) == 64  # a ramp, not a few repeats
    assert "linearGradient" in svg and "256 distinct" in svg
    # Every block holds other slices than its neighbours: boundaries between all 8 x 8.
    assert len(_lines(root, SLICE_COLOUR)) == 2 * 8 * 7 + 1
    assert "data=256 (dcn)" in svg and "fsdp=256 (ici)" in svg
    _assert_free_text_apart(root)
    _assert_legible(root)


def test_a_block_opens_its_own_devices_down_to_the_devices():
    """Overview -> 4 slices -> one slice's 256 devices; each level's blocks add up to it."""
    plan = _hardware_plan(slices=256, hosts_per_slice=64, chips_per_host=4, batch=65536)
    top = _parse(render_layout_svg(plan))
    second_href = _links(top)[1]
    assert second_href == "?slice=4-7"
    svg = render_layout_svg(plan, _scope(second_href))
    level = _parse(svg)
    assert "showing slices 4\u20137: 1,024 of 65,536 devices" in svg
    assert _links(level) == ["?slice=4", "?slice=5", "?slice=6", "?slice=7"]
    assert [label[0] for label in _labels(level)] == [f"slice {s}" for s in range(4, 8)]
    assert sum(_block_devices(label) for label in _labels(level)) == 1024
    _assert_legible(level)
    svg = render_layout_svg(plan, _scope("?slice=5"))
    devices = _parse(svg)
    assert _links(devices) == []
    labels = _labels(devices)
    assert len(labels) == 256 and {label[2].split()[0] for label in labels} == {"s5"}
    assert [int(label[0]) for label in labels] == list(range(5 * 256, 6 * 256))
    # The slice holds one batch range: its 256 devices are replicas and share one colour.
    assert len({g.find(f"{NS}rect").get("fill") for g in _cells(devices)}) == 1
    _assert_free_text_apart(devices)
    _assert_legible(devices)
    host = _parse(render_layout_svg(plan, _scope("?slice=5&host=330")))
    assert [label[2] for label in _labels(host)] == ["s5 h330"] * 4


def _walk(plan: dict, href: str | None, depth: int = 0) -> int:
    """Follows the first and the last link of every level down to device cells; checks at
    each level that the blocks' devices add up to the level's and that a block's link
    selects exactly its devices. Returns the depth reached."""
    root = _parse(render_layout_svg(plan, _scope(href) if href else None))
    _assert_legible(root)
    links = _links(root)
    if not links:
        return depth
    assert len(links) <= MAX_BLOCKS
    labels = _labels(root)
    total = len(plan["shards"]) if href is None else None
    if total is not None:
        assert sum(_block_devices(label) for label in labels) == total
    for i in (0, len(links) - 1):
        inner = _parse(render_layout_svg(plan, _scope(links[i])))
        inner_cells = _labels(inner)
        if _links(inner):
            assert sum(_block_devices(label) for label in inner_cells) == _block_devices(labels[i])
        else:
            assert len(inner_cells) == _block_devices(labels[i])
    return _walk(plan, links[-1], depth + 1)


@pytest.mark.parametrize(
    ("axes", "n", "depth", "first"),
    [
        ({"data": 65536}, 65536, 2, "positions 0\u20131023"),
        ({"data": 256, "model": 256}, 65536, 2, "data=0\u20133"),
        ({"data": 64, "fsdp": 32, "model": 32}, 65536, 2, "data=0"),
        ({"data": 128, "model": 8}, 1024, 1, "data=0\u20131"),
    ],
    ids=["1d-65536", "2d-65536", "3d-65536", "2d-1024"],
)
def test_plain_plans_open_level_by_level(axes, n, depth, first):
    plan = _plain_plan({"axes": axes, "batch_shape": [n]}, n)
    svg, seconds = _timed(plan)
    root = _parse(svg)
    _assert_summary_sized(root, svg, seconds)
    assert _labels(root)[0][0] == first
    assert f"{n:,} devices drawn as" in svg
    _assert_free_text_apart(root)
    assert _walk(plan, None) == depth


def test_hosts_as_blocks_inside_a_big_slice():
    plan = _hardware_plan(slices=2, hosts_per_slice=256, chips_per_host=4, batch=64)
    top = _parse(svg := render_layout_svg(plan))
    assert [label[0] for label in _labels(top)] == ["slice 0", "slice 1"]
    assert "(one per slice)" in svg and _links(top) == ["?slice=0", "?slice=1"]
    inside = _parse(svg := render_layout_svg(plan, _scope("?slice=1")))
    labels = _labels(inside)
    assert len(labels) == 64 and labels[0][:2] == ["hosts 256\u2013259", "16 devices"]
    assert _links(inside)[0] == "?slice=1&host=256-259"
    assert "(4 hosts each)" in svg
    # Two batch slices: categorical colours, one per slice, the same at every level.
    top_fills = [g.find(f"{NS}rect").get("fill") for g in _cells(top)]
    inside_fills = {g.find(f"{NS}rect").get("fill") for g in _cells(inside)}
    assert top_fills[0] != top_fills[1] and inside_fills == {top_fills[1]}
    assert "linearGradient" not in svg
    devices = _parse(render_layout_svg(plan, _scope(_links(inside)[0])))
    assert [label[2] for label in _labels(devices)] == [
        f"s1 h{h}" for h in range(256, 260) for _ in range(4)
    ]
    _assert_legible(devices)


def test_a_scope_spreads_the_ramp_over_its_own_rows():
    """A pod slice whose batch is split over data x fsdp is not one flat colour."""
    plan = _plain_plan(
        {
            "axes": {"data": 256, "fsdp": 256},
            "batch_shape": [65536],
            "batch_axes": ["data", "fsdp"],
        },
        65536,
    )
    row = _parse(svg := render_layout_svg(plan, _scope("?positions=256-511")))
    fills = [g.find(f"{NS}rect").get("fill") for g in _cells(row)]
    assert len(fills) == 256 and len(set(fills)) > 200  # 8-bit colour steps merge a few
    assert ">256</text>" in svg and ">512</text>" in svg  # the ramp's ends: the scope's rows


def test_block_labels_fit_their_blocks():
    """Long batch ranges and counts stay inside a block at a legible size."""
    plan = _plain_plan({"axes": {"data": 65536, "model": 4}, "batch_shape": [2**30]}, 2**18)
    root = _parse(render_layout_svg(plan))
    _assert_legible(root)
    for group in _cells(root):
        assert float(group.find(f"{NS}rect").get("width")) == BLOCK_W


@pytest.mark.parametrize(
    ("query", "hint"),
    [("slice=256", "slices 0-255"), ("host=5000-6000", "hosts 0-4095"),
     ("positions=70000", "positions 0-65535"), ("slice=3&host=0", "slices 0-255")],
    ids=["slice", "host", "positions", "disjoint"],
)  # fmt: skip
def test_a_scope_without_devices_says_what_exists(query, hint):
    plan = _hardware_plan(slices=256, hosts_per_slice=16, chips_per_host=16, batch=256)
    with pytest.raises(ServiceError) as err:
        render_layout_svg(plan, _scope("?" + query))
    assert err.value.code == "validation_error"
    assert "selects no device" in str(err.value) and hint in str(err.value)


def test_the_picture_says_which_experts_and_layers_each_device_holds(api):
    # issue 38: a plan with an expert axis (and one with stages) shows the split in its
    # header and each device's share in its tip
    moe = api.post("/v1/meshes", json={
        "hardware": "tpu-v5p", "topology": "2x2x2", "ici": {"fsdp": 2, "expert": 4},
        "batch_shape": [16, 4096], "model": {"name": "mixtral-8x7b"}})  # fmt: skip
    assert moe.status_code == 201, moe.text
    svg = api.get(f"/v1/meshes/{moe.json()['id']}/layout.svg").text
    assert "expert=4 splits the 8 experts: 2 per device" in svg
    tips = [t.text for t in _parse(svg).iter(f"{NS}title") if t.text and "device" in t.text]
    held = sorted({tip.split("; ")[-1] for tip in tips if "; " in tip})
    assert held == ["experts 0-1", "experts 2-3", "experts 4-5", "experts 6-7"]
    staged = api.post("/v1/meshes", json={
        "hardware": "tpu-v5p", "topology": "2x2x2", "ici": {"stage": 4, "fsdp": 2},
        "batch_shape": [16, 4096], "model": {"name": "llama3.1-8b"},
        "pipeline": {"microbatches": 4, "layers_per_stage": 2,
                     "schedule": "circular"}})  # fmt: skip
    assert staged.status_code == 201, staged.text
    svg = api.get(f"/v1/meshes/{staged.json()['id']}/layout.svg").text
    assert "stage=4 splits the 32 layers: 2 per device in each of 4 passes" in svg
    assert "layers 2-3, 10-11, 18-19, 26-27" in svg
