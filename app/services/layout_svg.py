"""A mesh plan as a standalone SVG picture: which device holds which batch slice.

Two layouts, chosen by size:

- **Devices** (up to :data:`MAX_CELLS` devices and :data:`MAX_COLUMNS` columns): one cell per
  device. 1-D meshes wrap every :data:`WRAP_1D` cells; 2-D meshes have rows = first axis,
  columns = second axis; more axes flatten the leading axes row-major into rows (each row
  labelled with its leading coordinates).
- **Blocks** (bigger meshes): one cell per host, else per slice (consecutive slices merged
  when there are more than :data:`MAX_BLOCKS`), else per process, else per row of the leading
  mesh axes, else per run of consecutive devices. Each block is labelled with its device
  count and the batch range it holds, so the picture stays bounded (about 2,000 x 1,500 px)
  for any mesh.

Hardware plans (shards with ``slice``/``host``) get their slice boundaries drawn as thick red
lines and host boundaries as dashed grey lines between the cells, and ``axes_detail`` puts
each axis's link class beside its name (``fsdp=16 (ici)``).

Colours follow batch dimension 0: while at most :data:`MAX_LEGEND` distinct slices exist,
each gets its own colour and a legend line; beyond that, a continuous ramp over the start
row of the slice (``0`` to the batch size), explained by a gradient legend. Replicas of one
slice always share a colour. Header lines (title, axes, the "N devices drawn as ..." note,
the axis labels) each have their own line, so none overlaps another.
"""

from __future__ import annotations

import colorsys
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from xml.sax.saxutils import escape

MAX_CELLS = 1024
MAX_COLUMNS = 64
MAX_BLOCKS = 1024
BLOCK_COLUMNS = 32
WRAP_1D = 16
MAX_LEGEND = 16

CELL_W = 76
CELL_H = 44
BLOCK_W = 84
BLOCK_H = 46
GAP = 6
MARGIN = 16
LEFT = 110
LINE = 18
CHAR_W = 0.6  # monospace advance per font-size unit, for layout and the overlap test
FONT = "font-family='monospace'"
SLICE_STROKE = "stroke='#c62828' stroke-width='3'"
HOST_STROKE = "stroke='#424242' stroke-width='2' stroke-dasharray='4 2'"
MIXED = "#d9d9d9"

# Viridis, sampled at 9 stops: perceptually even and readable on white.
_RAMP = [
    (0x44, 0x01, 0x54),
    (0x47, 0x2C, 0x7A),
    (0x3B, 0x51, 0x8B),
    (0x2C, 0x71, 0x8E),
    (0x21, 0x90, 0x8C),
    (0x27, 0xAD, 0x81),
    (0x5C, 0xC8, 0x63),
    (0xAA, 0xDC, 0x32),
    (0xFD, 0xE7, 0x25),
]


def _palette(i: int) -> str:
    """Distinct pastel colours: hues stepped by the golden angle (used for <= 16 slices)."""
    hue = (i * 0.618033988749895) % 1.0
    r, g, b = colorsys.hls_to_rgb(hue, 0.78, 0.6)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def _ramp(t: float) -> str:
    """The colour at ``t`` in [0, 1] on the viridis ramp."""
    t = min(max(t, 0.0), 1.0) * (len(_RAMP) - 1)
    i = min(int(t), len(_RAMP) - 2)
    f = t - i
    a, b = _RAMP[i], _RAMP[i + 1]
    return "#" + "".join(f"{round(x + (y - x) * f):02x}" for x, y in zip(a, b, strict=True))


def _text_colour(fill: str) -> str:
    r, g, b = (int(fill[i : i + 2], 16) for i in (1, 3, 5))
    return "#000000" if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "#ffffff"


def _t(x: float, y: float, text: str, *, size: int = 11, anchor: str = "middle", extra: str = ""):
    return (
        f"<text x='{x:.1f}' y='{y:.1f}' font-size='{size}' text-anchor='{anchor}' {FONT}"
        f"{(' ' + extra) if extra else ''}>{escape(text)}</text>"
    )


def _fit(text: str, width: int, size: int) -> int:
    """The font size, at most ``size``, at which ``text`` fits in ``width`` px (min 6)."""
    return max(6, min(size, int((width - 6) / (max(len(text), 1) * CHAR_W))))


def _text_width(text: str, size: int) -> float:
    return len(text) * size * CHAR_W


@dataclass
class _Cell:
    """One drawn cell (a device or a block) at grid position (row, col)."""

    row: int
    col: int
    fill: str
    lines: list[str]
    tip: str
    slice: Any = None
    host: Any = None


@dataclass
class _Colours:
    """Batch slice -> fill colour, categorical for few slices, a ramp for many."""

    keys: Mapping[tuple[int, int] | None, int]  # slice -> number of holders, first-seen order
    batch_size: int
    categorical: bool = field(init=False)
    table: dict[tuple[int, int] | None, str] = field(init=False)

    def __post_init__(self) -> None:
        self.categorical = len(self.keys) <= MAX_LEGEND
        # Categorical colours follow first appearance; ramp colours are made on demand.
        self.table = {k: _palette(i) for i, k in enumerate(self.keys)} if self.categorical else {}

    def colour(self, key: tuple[int, int] | None) -> str:
        if key not in self.table:
            self.table[key] = _ramp((key[0] if key else 0) / max(self.batch_size - 1, 1))
        return self.table[key]

    def of(self, keys: Sequence[tuple[int, int] | None]) -> str:
        """The fill of a cell holding these slices (a block may hold several)."""
        distinct = set(keys)
        if len(distinct) == 1 or not self.categorical:
            return self.colour(min(distinct, key=lambda k: k or (0, 0)))
        return MIXED


def _slice_key(shard: Mapping[str, Any]) -> tuple[int, int] | None:
    index = shard.get("index") or []
    return (int(index[0][0]), int(index[0][1])) if index else None


def _grid_shape(sizes: Sequence[int]) -> tuple[int, int, bool]:
    """(rows, columns, wrapped) of the device grid over all devices."""
    n = math.prod(sizes)
    if len(sizes) == 1:
        if n > WRAP_1D:
            return math.ceil(n / WRAP_1D), WRAP_1D, True
        return 1, n, False
    return n // sizes[-1], sizes[-1], False


def _axis_text(name: str, size: int, detail: Mapping[str, Mapping[str, Any]]) -> str:
    link = detail.get(name, {}).get("link")
    return f"{name}={size}" + (f" ({link})" if link else "")


def _device_cells(shards, names, colours, rows, cols) -> list[_Cell]:
    cells = []
    for p, shard in enumerate(shards[: rows * cols]):
        key = _slice_key(shard)
        coords = shard.get("coords") or {}
        coord_text = "(" + ",".join(str(coords.get(a, "?")) for a in names) + ")"
        lines = [str(shard.get("device")), coord_text]
        where = []
        if "slice" in shard:
            where.append(f"s{shard['slice']}")
        if "host" in shard:
            where.append(f"h{shard['host']}")
        if where:
            lines.append(" ".join(where))
        tip = f"device {shard.get('device')} {coord_text}"
        if key is not None:
            tip += f" batch[{key[0]}:{key[1]}] replica {shard.get('replica')}"
        if "physical" in shard:
            tip += f" physical {shard['physical']}"
            if "core" in shard:
                tip += f" core {shard['core']}"
        if where:
            tip += f" slice {shard.get('slice', '-')} host {shard.get('host', '-')}"
        cells.append(
            _Cell(p // cols, p % cols, colours.of([key]), lines, tip, shard.get("slice"),
                  (shard.get("slice"), shard.get("host")) if "host" in shard else None)
        )  # fmt: skip
    return cells


def _block_unit(shards, names, sizes) -> tuple[str, list[Any]]:
    """How to group devices into blocks: the unit's name and each device's group key."""
    n = len(shards)
    first = shards[0] if shards else {}
    if "host" in first:
        keys = [(s.get("slice"), s["host"]) for s in shards]
        if len(set(keys)) <= MAX_BLOCKS:
            return "host", keys
    if "slice" in first:
        return "slice", [s["slice"] for s in shards]
    procs = [s.get("process_index", 0) for s in shards]
    if 1 < len(set(procs)) <= MAX_BLOCKS:
        return "process", procs
    # Plain plans: one block per row of the longest prefix of axes that fits.
    prefix, count = 0, 1
    while prefix < len(sizes) - 1 and count * sizes[prefix] <= MAX_BLOCKS:
        count *= sizes[prefix]
        prefix += 1
    if count > 1:
        lead = names[:prefix]
        keys = [tuple((s.get("coords") or {}).get(a, "?") for a in lead) for s in shards]
        return f"row of {' x '.join(lead)}", keys
    chunk = math.ceil(n / MAX_BLOCKS)
    return f"run of {chunk} devices", [p // chunk for p in range(n)]


def _block_cells(shards, slice_keys, names, sizes, colours) -> tuple[str, list[_Cell]]:
    unit, keys = _block_unit(shards, names, sizes)
    order: dict[Any, int] = {}
    for k in keys:
        if k not in order:
            order[k] = len(order)
    merge = math.ceil(len(order) / MAX_BLOCKS)
    if merge > 1:
        unit = f"{merge} {unit}s"
    members: list[list[int]] = [[] for _ in range(math.ceil(len(order) / merge))]
    for p, k in enumerate(keys):
        members[order[k] // merge].append(p)
    group_keys = list(order)
    cols = min(BLOCK_COLUMNS, max(1, math.ceil(math.sqrt(len(members)))))
    cells = []
    for b, positions in enumerate(members):
        held = [slice_keys[p] for p in positions]
        distinct = set(held)
        lo = min((k[0] for k in distinct if k), default=None)
        hi = max((k[1] for k in distinct if k), default=None)
        first = shards[positions[0]]
        if unit.startswith("host"):
            name = (f"s{first['slice']} " if "slice" in first else "") + f"h{first['host']}"
        elif merge > 1:
            gk = group_keys[b * merge : (b + 1) * merge]
            name = f"{unit.split()[1][0]}{gk[0]}-{gk[-1]}"
        elif unit == "slice":
            name = f"slice {first['slice']}"
        elif unit == "process":
            name = f"proc {first.get('process_index', 0)}"
        elif unit.startswith("row"):
            name = "(" + ",".join(str(c) for c in group_keys[b]) + ")"
        else:
            name = f"{positions[0]}-{positions[-1]}"
        counts = f"{len(positions)} dev"
        hosts = {(shards[p].get("slice"), shards[p]["host"]) for p in positions} if (
            "host" in first and not unit.startswith("host")) else set()  # fmt: skip
        if hosts:
            counts += f"/{len(hosts)}h"
        batch_text = f"[{lo},{hi})" if lo is not None else "whole batch"
        tip = f"{name}: {len(positions)} devices ({positions[0]}..{positions[-1]} in mesh order)"
        if hosts:
            tip += f", {len(hosts)} hosts"
        tip += f", batch {batch_text}, {len(distinct)} distinct slice(s)"
        slices = {shards[p].get("slice") for p in positions}
        cells.append(
            _Cell(b // cols, b % cols, colours.of(held), [name, counts, batch_text], tip,
                  min(slices, key=str) if len(slices) == 1 else tuple(sorted(slices, key=str)),
                  (first.get("slice"), first["host"]) if unit.startswith("host") else None)
        )  # fmt: skip
    return unit, cells


def _boundaries(cells: list[_Cell], x0: float, y0: float, w: int, h: int) -> list[str]:
    """Lines in the gaps between neighbouring cells of different slices or hosts."""
    at = {(c.row, c.col): c for c in cells}
    out = []
    for c in cells:
        for dr, dc in ((0, 1), (1, 0)):
            other = at.get((c.row + dr, c.col + dc))
            if other is None:
                continue
            if c.slice != other.slice:
                style = SLICE_STROKE
            elif c.host is not None and c.host != other.host:
                style = HOST_STROKE
            else:
                continue
            if dc:
                x = x0 + (c.col + 1) * (w + GAP) - GAP / 2
                y = y0 + c.row * (h + GAP)
                out.append(f"<line x1='{x}' y1='{y - 2}' x2='{x}' y2='{y + h + 2}' {style}/>")
            else:
                y = y0 + (c.row + 1) * (h + GAP) - GAP / 2
                x = x0 + c.col * (w + GAP)
                out.append(f"<line x1='{x - 2}' y1='{y}' x2='{x + w + 2}' y2='{y}' {style}/>")
    return out


def render_layout_svg(plan: Mapping[str, Any]) -> str:
    """The SVG text for a stored plan (the dict of ``GET /v1/meshes/{id}``).

    Args:
      plan: the stored plan JSON; hardware fields (``axes_detail``, per-shard ``slice``,
        ``host``, ``physical``) are drawn when present and optional otherwise.

    Returns:
      A standalone SVG document, bounded in size for any number of devices.
    """
    axes: dict[str, int] = {str(k): int(v) for k, v in plan["axes"].items()}
    names, sizes = list(axes), list(axes.values())
    shards: list[dict[str, Any]] = plan.get("shards") or []
    n = len(shards)
    detail = {str(d["name"]): d for d in plan.get("axes_detail") or [] if "name" in d}
    batch = plan.get("batch") or None
    batch_size = int(batch["shape"][0]) if batch and batch.get("shape") else 0

    # Inline, not _slice_key per shard: 65,536 calls cost more than the rest of the picture.
    slice_keys = [
        (int(ix[0][0]), int(ix[0][1])) if (ix := shard.get("index")) else None for shard in shards
    ]
    holders = Counter(slice_keys)  # first-seen order
    colours = _Colours(holders, batch_size)

    rows, cols, wrapped = _grid_shape(sizes)
    blocks = n > MAX_CELLS or cols > MAX_COLUMNS
    if blocks:
        unit, cells = _block_cells(shards, slice_keys, names, sizes, colours)
        w, h, left = BLOCK_W, BLOCK_H, MARGIN
    else:
        cells = _device_cells(shards, names, colours, rows, cols)
        unit, w, h, left = "", CELL_W, CELL_H, LEFT
    grid_rows = max((c.row for c in cells), default=-1) + 1
    grid_cols = max((c.col for c in cells), default=-1) + 1

    # Header: one line per text, so nothing overlaps.
    title = str(plan.get("name") or plan.get("id", "mesh plan"))
    shape_text = " x ".join(_axis_text(k, v, detail) for k, v in axes.items())
    kind = "live" if plan.get("live") else "abstract"
    header: list[tuple[str, int, str]] = [
        (title, 15, "font-weight='bold'"),
        (f"mesh {shape_text}, {n} devices, {kind}, platform {plan.get('platform') or '-'}", 11, ""),
    ]
    if detail:
        links = ", ".join(
            f"{a}: {d.get('link', '?')} ici={d.get('ici', '?')} dcn={d.get('dcn', '?')}"
            + (f" {float(d['bytes_per_s']):.3g} B/s" if d.get("bytes_per_s") else "")
            for a, d in detail.items()
        )
        header.append((f"links {links}", 11, ""))
    if blocks:
        header.append(
            (f"{n} devices drawn as {len(cells)} blocks (one per {unit})", 11, "fill='#b00020'")
        )
    else:
        if len(sizes) == 1 and wrapped:
            col_axis = f"{_axis_text(names[0], sizes[0], detail)} mod {WRAP_1D}"
            row_axis = f"{names[0]} div {WRAP_1D}"
        elif len(sizes) == 1:
            col_axis, row_axis = _axis_text(names[0], sizes[0], detail), ""
        else:
            col_axis = _axis_text(names[-1], sizes[-1], detail)
            row_axis = " x ".join(
                _axis_text(a, s, detail) for a, s in zip(names[:-1], sizes[:-1], strict=True)
            )
        header.append((f"columns \u2192 {col_axis}", 12, ""))
        if row_axis:
            header.append((f"rows \u2193 {row_axis}", 12, ""))

    out: list[str] = []
    y = 8.0
    for text, size, extra in header:
        y += size + 7
        out.append(_t(MARGIN, y, text, size=size, anchor="start", extra=extra))
    top = y + (26 if not blocks else 12)
    if not blocks:
        for c in range(grid_cols):
            out.append(_t(left + c * (w + GAP) + w / 2, top - 8, str(c), size=10))
        for r in range(grid_rows):
            if len(sizes) == 1:
                label = str(r) if wrapped else ""
            else:
                rem, coord = r, []
                for size in reversed(sizes[:-1]):
                    coord.append(rem % size)
                    rem //= size
                label = ",".join(str(c) for c in reversed(coord))
            if label:
                out.append(_t(left - 8, top + r * (h + GAP) + h / 2 + 4, label, anchor="end"))

    for cell in cells:
        x = left + cell.col * (w + GAP)
        cy = top + cell.row * (h + GAP)
        ink = f"fill='{_text_colour(cell.fill)}'"
        body = "".join(
            _t(
                x + w / 2,
                cy + 15 + 13 * i,
                line,
                size=_fit(line, w, 12 if i == 0 else 9),
                extra=ink,
            )
            for i, line in enumerate(cell.lines)
        )
        out.append(
            f"<g><title>{escape(cell.tip)}</title>"
            f"<rect x='{x}' y='{cy}' width='{w}' height='{h}' rx='4' fill='{cell.fill}' "
            f"stroke='#333333' stroke-width='1'/>{body}</g>"
        )
    lines = _boundaries(cells, left, top, w, h)
    has_slices = any(SLICE_STROKE in line for line in lines)
    has_hosts = any(HOST_STROKE in line for line in lines)
    out.extend(lines)

    # Legend.
    y = top + grid_rows * (h + GAP) + 22
    if batch:
        spec0 = (batch.get("spec") or [None])[0]
        split = (
            "replicated"
            if spec0 is None
            else f"split over {spec0 if isinstance(spec0, str) else ' x '.join(spec0)}"
        )
        heading = f"batch {batch.get('shape')} dim 0 {split}; colour = slice of dim 0"
    else:
        heading = "no batch_shape: every device holds the same (empty) slice"
    legend = [_t(MARGIN, y, heading, anchor="start", extra="font-weight='bold'")]
    widths = [_text_width(heading, 11)]
    if colours.categorical:
        for key, colour in colours.table.items():
            y += LINE
            text = "whole batch" if key is None else f"[{key[0]}, {key[1]})"
            text = f"{text}: {holders[key]} device(s)"
            legend.append(
                f"<rect x='{MARGIN}' y='{y - 10}' width='14' height='12' fill='{colour}' "
                f"stroke='#333333'/>" + _t(MARGIN + 22, y, text, anchor="start")
            )
            widths.append(22 + _text_width(text, 11))
        if blocks and any(c.fill == MIXED for c in cells):
            y += LINE
            legend.append(
                f"<rect x='{MARGIN}' y='{y - 10}' width='14' height='12' fill='{MIXED}' "
                f"stroke='#333333'/>"
                + _t(MARGIN + 22, y, "block holding several slices", anchor="start")
            )
    else:
        y += LINE
        ticks = [i / (len(_RAMP) - 1) for i in range(len(_RAMP))]
        stops = "".join(f"<stop offset='{t:.3f}' stop-color='{_ramp(t)}'/>" for t in ticks)
        legend.append(
            f"<defs><linearGradient id='batch-ramp'>{stops}</linearGradient></defs>"
            f"<rect x='{MARGIN}' y='{y - 10}' width='240' height='12' fill='url(#batch-ramp)' "
            f"stroke='#333333'/>"
        )
        legend.append(_t(MARGIN, y + 14, "0", size=10, anchor="start"))
        legend.append(_t(MARGIN + 240, y + 14, str(batch_size), size=10, anchor="end"))
        y += LINE + 8
        text = (
            f"continuous ramp over the start row of each slice ({len(holders)} distinct "
            f"slices of dim 0, {holders[next(iter(holders))]} device(s) each)"
            if len(set(holders.values())) == 1
            else f"continuous ramp over the start row of each slice ({len(holders)} slices)"
        )
        legend.append(_t(MARGIN, y, text, anchor="start"))
        widths.append(_text_width(text, 11))
    if has_slices:
        y += LINE
        legend.append(
            f"<line x1='{MARGIN}' y1='{y - 4}' x2='{MARGIN + 14}' y2='{y - 4}' {SLICE_STROKE}/>"
            + _t(MARGIN + 22, y, "slice boundary (dcn between slices)", anchor="start")
        )
    if has_hosts:
        y += LINE
        legend.append(
            f"<line x1='{MARGIN}' y1='{y - 4}' x2='{MARGIN + 14}' y2='{y - 4}' {HOST_STROKE}/>"
            + _t(MARGIN + 22, y, "host boundary", anchor="start")
        )
    if blocks:
        y += LINE
        text = f"block label: {unit}, devices[/hosts], batch rows held"
        legend.append(_t(MARGIN, y, text, anchor="start"))
        widths.append(_text_width(text, 11))
    out.extend(legend)

    widths += [_text_width(text, size) for text, size, _ in header]
    width = math.ceil(
        max(left + grid_cols * (w + GAP), 520, MARGIN + max(widths, default=0)) + MARGIN
    )
    height = math.ceil(y + MARGIN)
    head = [
        "<?xml version='1.0' encoding='UTF-8'?>",
        f"<svg xmlns='http://www.w3.org/2000/svg' version='1.1' width='{width}' "
        f"height='{height}' viewBox='0 0 {width} {height}'>",
        f"<title>{escape(f'{title}: {shape_text} ({n} devices)')}</title>",
        f"<rect x='0' y='0' width='{width}' height='{height}' fill='#ffffff'/>",
    ]
    return "\n".join(head + out + ["</svg>"]) + "\n"
