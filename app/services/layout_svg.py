"""A mesh plan as a standalone SVG picture: which device holds which batch slice.

The picture shows one *scope* of the plan: all its devices (the default), or the devices
that the filters ``slice``, ``host``, ``process`` and ``positions`` select (each a number
``N`` or an inclusive range ``N-M``; several filters intersect; ``positions`` counts devices
in mesh order, the order of the plan's ``shards``). Two layouts, chosen by the scope's size:

- **Devices** (up to :data:`MAX_CELLS` devices): one cell per device, labelled with its id
  and mesh coordinates (and ``s``/``h`` for slice and host). The whole plan of a small mesh
  is drawn as its device grid: 1-D meshes wrap every :data:`WRAP` cells; 2-D meshes have
  rows = first axis, columns = second axis; more axes flatten the leading axes row-major
  into rows (each row labelled with its leading coordinates). A scope wraps its devices in
  rows of the last mesh axis (or of :data:`WRAP` when that axis is longer).
- **Blocks** (bigger scopes): a summary grid of at most :data:`MAX_BLOCKS` blocks, one per
  slice, else per host, else per process, else per row of the leading mesh axes, else per
  run of consecutive devices; when there are more groups than blocks, consecutive groups
  share a block (``slices 0-3``). Each block is labelled with what it is, its device (and
  host) count and the batch rows it holds, in text of at least :data:`MIN_FONT` px at the
  picture's natural size, and is a link (``<a href="?slice=3">``, a query-only reference)
  to the picture of its own devices: opened on its own, the SVG's links lead to the next
  picture; the dashboard follows the same links in its page (``/plans/{id}?slice=3``).
  So a 65,536-device plan of 256 slices opens as 64 blocks of 4 slices, then 4 slices, then
  the 256 devices of one slice; every step stays legible, and the picture stays about
  1,200 x 900 px.

Design choices: the summary is bounded by blocks, not by shrinking text (a 16 x 16 grid of
slices scaled into a page had 5 px text); the scope is a filter over the stored plan, so a
picture's address is a stable, shareable name for it.

Hardware plans (shards with ``slice``/``host``) get their slice boundaries drawn as thick red
lines and host boundaries as dashed grey lines between the cells, and ``axes_detail`` puts
each axis's link class beside its name (``fsdp=16 (ici)``) and its bandwidth in bytes per
second with SI prefixes (``6.25 GB/s`` = 6.25e9 B/s), as the dashboard's tables write it.

Colours follow batch dimension 0: while the whole plan has at most :data:`MAX_LEGEND`
distinct slices, each gets its own colour (the same in every scope) and a legend line;
beyond that, a continuous ramp over the start row of the slice, from the first to the last
row the scope holds (a slice of a pod is not one flat colour), explained by a gradient
legend. Replicas of one slice always share a colour. Header lines (title, axes, links,
scope, the "N devices drawn as ..." note, the axis labels) each have their own line, so none
overlaps another.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from xml.sax.saxutils import escape, quoteattr

from app.core.errors import InvalidParameter
from app.services.layout_cells import (
    MAX_CELLS,
    MAX_COLUMNS,
    MIXED,
    RAMP,
    WRAP,
    Cell,
    Colours,
    ModelSplit,
    batch_rows,
    block_cells,
    device_cells,
    grid_row_labels,
    grid_shape,
    model_splits,
    plural,
    ramp,
)
from app.services.layout_scope import SCOPE_PARAMS, scope_text, select_positions

MIN_FONT = 10

CELL_W = 66
CELL_H = 54
BLOCK_W = 136
BLOCK_H = 54  # plus PITCH per line past the third
PITCH = 14  # baseline to baseline inside a cell
GAP = 6
MARGIN = 16
LINE = 18
CHAR_W = 0.6  # monospace advance per font-size unit, for layout and the overlap test
FONT = "font-family='monospace'"
SLICE_STROKE = "stroke='#c62828' stroke-width='3'"
HOST_STROKE = "stroke='#424242' stroke-width='2' stroke-dasharray='4 2'"


def _text_colour(fill: str) -> str:
    r, g, b = (int(fill[i : i + 2], 16) for i in (1, 3, 5))
    return "#000000" if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "#ffffff"


def _t(
    x: float, y: float, text: str, *, size: int = 11, anchor: str = "middle", extra: str = ""
) -> str:
    return (
        f"<text x='{x:.1f}' y='{y:.1f}' font-size='{size}' text-anchor='{anchor}' {FONT}"
        f"{(' ' + extra) if extra else ''}>{escape(text)}</text>"
    )


def _fit(text: str, width: int, size: int) -> int:
    """The font size, at most ``size``, at which ``text`` fits in ``width`` px (at least
    :data:`MIN_FONT`: longer text is cut by :func:`_clip` instead of shrunk)."""
    return max(MIN_FONT, min(size, int((width - 6) / (max(len(text), 1) * CHAR_W))))


def _clip(text: str, width: int, size: int) -> str:
    """``text`` cut with an ellipsis to fit ``width`` px at ``size``; a block's ``batch
    rows a-b`` that does not fit says ``rows a-b`` first (the legend names the batch)."""
    room = max(1, int((width - 6) / (size * CHAR_W)))
    if len(text) > room and text.startswith("batch rows "):
        text = text.removeprefix("batch ")
    return text if len(text) <= room else text[: room - 1] + "\u2026"


def _text_width(text: str, size: int) -> float:
    return len(text) * size * CHAR_W


def format_rate(bytes_per_s: float) -> str:
    """Bytes per second with SI prefixes, 3 significant digits: ``6.25 GB/s`` (the
    dashboard's ``rate()`` writes the same text)."""
    v = float(bytes_per_s)
    for unit in ("B/s", "kB/s", "MB/s", "GB/s", "TB/s"):
        if abs(v) < 1000 or unit == "TB/s":
            return f"{float(f'{v:.3g}'):g} {unit}"
        v /= 1000
    raise AssertionError("unreachable")


def _axis_text(name: str, size: int, detail: Mapping[str, Mapping[str, Any]]) -> str:
    link = detail.get(name, {}).get("link")
    return f"{name}={size}" + (f" ({link})" if link else "")


def _boundaries(cells: list[Cell], x0: float, y0: float, w: int, h: int) -> list[str]:
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


SliceKey = tuple[int, int] | None  # batch dim-0 rows [start, stop) a device holds; None: all
HeaderLine = tuple[str, int, str]  # text, font size, extra attributes


@dataclass(frozen=True)
class _PlanFacts:
    """What the picture reads of a stored plan, read once."""

    title: str
    axes: dict[str, int]  # mesh axis name -> size, in mesh order
    shards: list[dict[str, Any]]  # one per device, in mesh order
    detail: dict[str, Mapping[str, Any]]  # axis name -> its ``axes_detail`` entry
    batch: Mapping[str, Any] | None
    slice_keys: list[SliceKey]  # per shard
    holders: Counter[SliceKey]  # slice -> number of devices holding it, first-seen order
    splits: list[ModelSplit] = field(default_factory=list)  # experts, layers over axes

    @property
    def names(self) -> list[str]:
        return list(self.axes)

    @property
    def sizes(self) -> list[int]:
        return list(self.axes.values())

    @property
    def n(self) -> int:
        return len(self.shards)


@dataclass(frozen=True)
class _Grid:
    """The cells to draw and their geometry.

    ``mode`` is ``"blocks"`` (a summary of blocks), ``"grid"`` (the whole plan as its
    device grid, with axis labels) or ``"scope"`` (the devices of a scope in rows).
    """

    mode: Literal["blocks", "grid", "scope"]
    cells: list[Cell]
    cell_w: int
    cell_h: int
    left: int  # x of the first column: room for the row labels of a device grid
    how: str = ""  # blocks only: what one block is, for the header note
    row_labels: list[str] = field(default_factory=list)  # device grid only

    @property
    def rows(self) -> int:
        return max((c.row for c in self.cells), default=-1) + 1

    @property
    def cols(self) -> int:
        return max((c.col for c in self.cells), default=-1) + 1


@dataclass
class _Legend:
    """The legend under the grid, built row by row: its SVG parts, the widths of the text
    that sets the picture's width, and ``y``, the baseline of its last row."""

    y: float
    parts: list[str] = field(default_factory=list)
    widths: list[float] = field(default_factory=list)

    def text(self, text: str, *, advance: float, extra: str = "") -> None:
        """A row of text ``advance`` px below the last one."""
        self.y += advance
        self.parts.append(_t(MARGIN, self.y, text, anchor="start", extra=extra))
        self.widths.append(_text_width(text, 11))

    def swatch(self, fill: str, text: str) -> None:
        """A row: a box of colour ``fill``, then ``text``."""
        self.y += LINE
        self.parts.append(
            f"<rect x='{MARGIN}' y='{self.y - 10}' width='14' height='12' fill='{fill}' "
            f"stroke='#333333'/>" + _t(MARGIN + 22, self.y, text, anchor="start")
        )
        self.widths.append(22 + _text_width(text, 11))

    def stroke(self, style: str, text: str) -> None:
        """A row: a short line drawn in ``style``, then ``text``."""
        self.y += LINE
        self.parts.append(
            f"<line x1='{MARGIN}' y1='{self.y - 4}' x2='{MARGIN + 14}' y2='{self.y - 4}' "
            f"{style}/>" + _t(MARGIN + 22, self.y, text, anchor="start")
        )
        self.widths.append(22 + _text_width(text, 11))


def render_layout_svg(
    plan: Mapping[str, Any], scope: Mapping[str, tuple[int, int]] | None = None
) -> str:
    """The SVG text for a stored plan (the dict of ``GET /v1/meshes/{id}``).

    Args:
      plan: the stored plan JSON; hardware fields (``axes_detail``, per-shard ``slice``,
        ``host``, ``physical``) are drawn when present and optional otherwise.
      scope: the devices to draw (:func:`~app.services.layout_scope.parse_scope`); None or
        empty: all of them.

    Returns:
      A standalone SVG document, about 1,200 x 900 px at most for block pictures.

    Raises:
      InvalidParameter: the scope selects no device of this plan (422 ``validation_error``
        naming the first filter, with the plan's ranges in the message).
    """
    scope = dict(scope or {})
    facts = _read_plan(plan)
    positions = _scope_positions(plan, facts, scope)
    colours = _colours(facts, scope, positions)
    grid = _lay_out(facts, scope, positions, colours)
    header = _header_lines(plan, facts, scope, positions, grid)

    out: list[str] = []
    y = 8.0
    for text, size, extra in header:
        y += size + 7
        out.append(_t(MARGIN, y, text, size=size, anchor="start", extra=extra))
    top = y + (26 if grid.mode == "grid" else 12)
    out += _grid_labels(grid, top)
    out += _cell_groups(grid, top)
    lines = _boundaries(grid.cells, grid.left, top, grid.cell_w, grid.cell_h)
    out += lines
    legend = _legend(facts, grid, colours, positions, top, lines)
    out += legend.parts

    widths = legend.widths + [_text_width(text, size) for text, size, _ in header]
    return _document(facts, scope, grid, out, widths, legend.y)


def _read_plan(plan: Mapping[str, Any]) -> _PlanFacts:
    """The fields the picture draws, each read (and converted) once."""
    shards: list[dict[str, Any]] = plan.get("shards") or []
    # Inline, not _slice_key per shard: 65,536 calls cost more than the rest of the picture.
    slice_keys = [
        (int(ix[0][0]), int(ix[0][1])) if (ix := shard.get("index")) else None for shard in shards
    ]
    return _PlanFacts(
        title=str(plan.get("name") or plan.get("id", "mesh plan")),
        axes={str(k): int(v) for k, v in plan["axes"].items()},
        shards=shards,
        detail={str(d["name"]): d for d in plan.get("axes_detail") or [] if "name" in d},
        batch=plan.get("batch") or None,
        slice_keys=slice_keys,
        holders=Counter(slice_keys),
        splits=model_splits(plan),
    )


def _scope_positions(
    plan: Mapping[str, Any], facts: _PlanFacts, scope: Mapping[str, tuple[int, int]]
) -> list[int]:
    """The positions of the devices to draw; raises when a scope selects none."""
    n = facts.n
    positions = select_positions(facts.shards, scope) if scope else list(range(n))
    if scope and not positions:
        name = next(k for k in SCOPE_PARAMS if k in scope)
        slices = plan.get("slices")
        hint = f"this plan has {plural(n, 'device')} (positions 0-{n - 1})"
        if slices:
            hint += f", slices 0-{int(slices) - 1}"
        if plan.get("hosts"):
            hint += f", hosts 0-{int(plan['hosts']) - 1}"
        raise InvalidParameter(("query", name), f"{scope_text(scope)} selects no device; {hint}")
    return positions


def _colours(
    facts: _PlanFacts, scope: Mapping[str, tuple[int, int]], positions: list[int]
) -> Colours:
    """Fills by batch slice: categorical for few slices, else a ramp over the scope's rows."""
    batch = facts.batch
    batch_size = int(batch["shape"][0]) if batch and batch.get("shape") else 0
    # The ramp spans the batch rows of the scope: a slice of a pod is not one flat colour.
    low, high = 0, batch_size
    if scope and batch_size:
        held = [k for k in {facts.slice_keys[p] for p in positions} if k]
        low, high = min(k[0] for k in held), max(k[1] for k in held)
    return Colours(facts.holders, low, high)


def _lay_out(
    facts: _PlanFacts,
    scope: Mapping[str, tuple[int, int]],
    positions: list[int],
    colours: Colours,
) -> _Grid:
    """Blocks for a big scope (or a whole grid too wide), else one cell per device."""
    shards, names, sizes = facts.shards, facts.names, facts.sizes
    _, cols, wrapped = grid_shape(sizes)
    if len(positions) > MAX_CELLS or (not scope and cols > MAX_COLUMNS):
        how, cells = block_cells(shards, positions, facts.slice_keys, names, sizes, colours, scope)
        most = max(len(c.lines) for c in cells)
        return _Grid("blocks", cells, BLOCK_W, BLOCK_H + PITCH * max(0, most - 3), MARGIN, how)
    if not scope:
        cells = device_cells(shards, positions, names, colours, cols, facts.splits)
        labels = grid_row_labels(sizes, wrapped, max(c.row for c in cells) + 1)
        widest = max((_text_width(t, 11) for t in labels), default=0)
        left = math.ceil(MARGIN + widest + 14)
        return _Grid("grid", cells, CELL_W, CELL_H, left, row_labels=labels)
    wrap = sizes[-1] if sizes[-1] <= MAX_COLUMNS else WRAP
    cols = min(wrap, len(positions))
    cells = device_cells(shards, positions, names, colours, cols, facts.splits)
    return _Grid("scope", cells, CELL_W, CELL_H, MARGIN)


def _shape_text(facts: _PlanFacts) -> str:
    """The mesh shape with link classes: ``data=2 (dcn) x fsdp=8 (ici)``."""
    return " x ".join(_axis_text(k, v, facts.detail) for k, v in facts.axes.items())


def _header_lines(
    plan: Mapping[str, Any],
    facts: _PlanFacts,
    scope: Mapping[str, tuple[int, int]],
    positions: list[int],
    grid: _Grid,
) -> list[HeaderLine]:
    """The header, one line per text so nothing overlaps."""
    n = facts.n
    kind = "live" if plan.get("live") else "abstract"
    header: list[HeaderLine] = [
        (facts.title, 15, "font-weight='bold'"),
        (f"mesh {_shape_text(facts)}, {plural(n, 'device')}, {kind}, "
         f"platform {plan.get('platform') or '-'}", 12, ""),
    ]  # fmt: skip
    header += [(split.header(), 12, "") for split in facts.splits]
    for a, d in facts.detail.items():
        rate = f", {format_rate(d['bytes_per_s'])}" if d.get("bytes_per_s") else ""
        header.append(
            (f"axis {a}: {d.get('link', '?')}, ici={d.get('ici', '?')} "
             f"dcn={d.get('dcn', '?')}{rate}", 12, "")
        )  # fmt: skip
    if scope:
        header.append(
            (f"showing {scope_text(scope)}: {len(positions):,} of {plural(n, 'device')}", 12,
             "font-weight='bold'")
        )  # fmt: skip
    if grid.mode == "blocks":
        header.append(
            (f"{plural(len(positions), 'device')} drawn as {plural(len(grid.cells), 'block')} "
             f"({grid.how}); click a block to open it", 12, "fill='#b00020'")
        )  # fmt: skip
    elif grid.mode == "grid":
        header += _grid_axes_lines(facts)
    else:
        header.append(("devices in mesh order, left to right", 12, ""))
    return header


def _grid_axes_lines(facts: _PlanFacts) -> list[HeaderLine]:
    """Which mesh axes the columns and rows of the whole device grid follow."""
    names, sizes, detail = facts.names, facts.sizes, facts.detail
    _, _, wrapped = grid_shape(sizes)
    if len(sizes) == 1 and wrapped:
        col_axis = f"{_axis_text(names[0], sizes[0], detail)} mod {WRAP}"
        row_axis = f"{names[0]} div {WRAP}"
    elif len(sizes) == 1:
        col_axis, row_axis = _axis_text(names[0], sizes[0], detail), ""
    else:
        col_axis = _axis_text(names[-1], sizes[-1], detail)
        row_axis = " x ".join(
            _axis_text(a, s, detail) for a, s in zip(names[:-1], sizes[:-1], strict=True)
        )
    lines: list[HeaderLine] = [(f"columns \u2192 {col_axis}", 12, "")]
    if row_axis:
        lines.append((f"rows \u2193 {row_axis}", 12, ""))
    return lines


def _grid_labels(grid: _Grid, top: float) -> list[str]:
    """The column numbers and row labels of the whole device grid (none otherwise)."""
    if grid.mode != "grid":
        return []
    w, h, left = grid.cell_w, grid.cell_h, grid.left
    out = [
        _t(left + c * (w + GAP) + w / 2, top - 8, str(c), size=MIN_FONT) for c in range(grid.cols)
    ]
    for r, label in enumerate(grid.row_labels):
        if label:
            out.append(_t(left - 8, top + r * (h + GAP) + h / 2 + 4, label, anchor="end"))
    return out


def _cell_groups(grid: _Grid, top: float) -> list[str]:
    """One group per cell: its box, its lines of text and its tooltip; a block is a link."""
    w, h, blocks = grid.cell_w, grid.cell_h, grid.mode == "blocks"
    out = []
    for cell in grid.cells:
        x = grid.left + cell.col * (w + GAP)
        cy = top + cell.row * (h + GAP)
        ink = f"fill='{_text_colour(cell.fill)}'"
        parts = []
        for i, line in enumerate(cell.lines):
            size = _fit(line, w, (13 if blocks else 12) if i == 0 else 11)
            extra = ink + (" font-weight='bold'" if blocks and i == 0 else "")
            parts.append(_t(x + w / 2, cy + 16 + PITCH * i, _clip(line, w, size), size=size,
                            extra=extra))  # fmt: skip
        group = (
            f"<g><title>{escape(cell.tip)}</title>"
            f"<rect x='{x}' y='{cy}' width='{w}' height='{h}' rx='4' fill='{cell.fill}' "
            f"stroke='#333333' stroke-width='1'/>{''.join(parts)}</g>"
        )
        if cell.href:
            href = quoteattr(cell.href)
            group = f"<a href={href} xlink:href={href} class='block'>{group}</a>"
        out.append(group)
    return out


def _legend(
    facts: _PlanFacts,
    grid: _Grid,
    colours: Colours,
    positions: list[int],
    top: float,
    boundaries: list[str],
) -> _Legend:
    """The legend under the grid: the batch, its colours, the boundary lines drawn."""
    legend = _Legend(top + grid.rows * (grid.cell_h + GAP) + 22)
    legend.text(_batch_heading(facts.batch), advance=0, extra="font-weight='bold'")
    if colours.categorical:
        shown = {facts.slice_keys[p] for p in positions}
        for key, colour in colours.table.items():
            if key in shown:
                text = batch_rows(*(key or (None, None)))
                legend.swatch(colour, f"{text}: {plural(facts.holders[key], 'device')}")
        if grid.mode == "blocks" and any(c.fill == MIXED for c in grid.cells):
            legend.swatch(MIXED, "block holding several slices")
    else:
        _ramp_legend(legend, colours, facts.holders)
    if any(SLICE_STROKE in line for line in boundaries):
        legend.stroke(SLICE_STROKE, "slice boundary (dcn between slices)")
    if any(HOST_STROKE in line for line in boundaries):
        legend.stroke(HOST_STROKE, "host boundary")
    if grid.mode == "blocks":
        text = "block: what it holds, its devices (and hosts), the batch rows it holds"
        legend.text(text, advance=LINE)
    return legend


def _batch_heading(batch: Mapping[str, Any] | None) -> str:
    """The legend's first line: the batch shape and how dim 0 is split."""
    if not batch:
        return "no batch_shape: every device holds the same (empty) slice"
    spec0 = (batch.get("spec") or [None])[0]
    split = (
        "replicated"
        if spec0 is None
        else f"split over {spec0 if isinstance(spec0, str) else ' x '.join(spec0)}"
    )
    return f"batch {batch.get('shape')} dim 0 {split}; colour = slice of dim 0"


def _ramp_legend(legend: _Legend, colours: Colours, holders: Counter[SliceKey]) -> None:
    """The gradient bar from the scope's first to last batch row, and what it means."""
    legend.y += LINE
    y = legend.y
    ticks = [i / (len(RAMP) - 1) for i in range(len(RAMP))]
    stops = "".join(f"<stop offset='{t:.3f}' stop-color='{ramp(t)}'/>" for t in ticks)
    legend.parts.append(
        f"<defs><linearGradient id='batch-ramp'>{stops}</linearGradient></defs>"
        f"<rect x='{MARGIN}' y='{y - 10}' width='240' height='12' fill='url(#batch-ramp)' "
        f"stroke='#333333'/>"
    )
    legend.parts.append(_t(MARGIN, y + 14, str(colours.low), size=MIN_FONT, anchor="start"))
    legend.parts.append(_t(MARGIN + 240, y + 14, str(colours.high), size=MIN_FONT, anchor="end"))
    each = next(iter(holders.values()))
    text = (
        f"continuous ramp over the start row of each slice ({len(holders):,} distinct "
        f"slices of dim 0, {plural(each, 'device')} each)"
        if len(set(holders.values())) == 1
        else f"continuous ramp over the start row of each slice ({len(holders):,} slices)"
    )
    legend.text(text, advance=LINE + 8)


def _document(
    facts: _PlanFacts,
    scope: Mapping[str, tuple[int, int]],
    grid: _Grid,
    body: list[str],
    widths: list[float],
    bottom: float,
) -> str:
    """The SVG document around ``body``, sized to the grid, the text and ``bottom``."""
    width = math.ceil(
        max(grid.left + grid.cols * (grid.cell_w + GAP), 520, MARGIN + max(widths, default=0))
        + MARGIN
    )
    height = math.ceil(bottom + MARGIN)
    caption = f"{facts.title}: {_shape_text(facts)} ({plural(facts.n, 'device')})"
    if scope:
        caption += f", {scope_text(scope)}"
    head = [
        "<?xml version='1.0' encoding='UTF-8'?>",
        f"<svg xmlns='http://www.w3.org/2000/svg' xmlns:xlink='http://www.w3.org/1999/xlink' "
        f"version='1.1' width='{width}' height='{height}' viewBox='0 0 {width} {height}'>",
        f"<title>{escape(caption)}</title>",
        f"<rect x='0' y='0' width='{width}' height='{height}' fill='#ffffff'/>",
    ]
    return "\n".join(head + body + ["</svg>"]) + "\n"
