"""A mesh plan as a standalone SVG picture: which device holds which batch slice.

Layout of the picture:

- 1-D meshes: one row of cells (wrapped every 16 cells for long meshes);
- 2-D meshes: rows = first axis, columns = second axis;
- more axes: columns = the last axis, rows = the leading axes flattened row-major (each
  row labelled with its leading coordinates).

Each cell is a device: its id, its mesh coordinates, and a fill colour per batch slice
(the ``[start, stop)`` range of batch dimension 0), so replicas of one slice share a
colour. Axis names label the edges; a legend maps colours to slices. At most
:data:`MAX_CELLS` cells are drawn; bigger meshes show their first rows and columns and say
so in the picture.
"""

from __future__ import annotations

import colorsys
import math
from collections.abc import Mapping, Sequence
from typing import Any
from xml.sax.saxutils import escape

MAX_CELLS = 1024
MAX_COLUMNS = 64
WRAP_1D = 16
MAX_LEGEND = 16

CELL_W = 76
CELL_H = 44
GAP = 4
MARGIN = 16
LEFT = 110
TOP = 74
FONT = "font-family='monospace'"


def _colour(i: int) -> str:
    """Distinct pastel colours: hues stepped by the golden angle."""
    hue = (i * 0.618033988749895) % 1.0
    r, g, b = colorsys.hls_to_rgb(hue, 0.78, 0.6)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def _t(x: float, y: float, text: str, *, size: int = 11, anchor: str = "middle", extra: str = ""):
    return (
        f"<text x='{x:.1f}' y='{y:.1f}' font-size='{size}' text-anchor='{anchor}' {FONT}"
        f"{(' ' + extra) if extra else ''}>{escape(text)}</text>"
    )


def _grid_shape(sizes: Sequence[int]) -> tuple[int, int, bool]:
    """(rows, columns, wrapped) of the drawn grid over all devices."""
    n = math.prod(sizes)
    if len(sizes) == 1:
        if n > WRAP_1D:
            return math.ceil(n / WRAP_1D), WRAP_1D, True
        return 1, n, False
    return n // sizes[-1], sizes[-1], False


def render_layout_svg(plan: Mapping[str, Any]) -> str:
    """The SVG text for a stored plan (the dict of ``GET /v1/meshes/{id}``)."""
    axes: dict[str, int] = {str(k): int(v) for k, v in plan["axes"].items()}
    names = list(axes)
    sizes = list(axes.values())
    shards: list[dict[str, Any]] = plan.get("shards") or []
    n = len(shards)
    rows, cols, wrapped = _grid_shape(sizes)
    cols_drawn = min(cols, MAX_COLUMNS)
    rows_drawn = min(rows, max(1, MAX_CELLS // cols_drawn))
    batch = plan.get("batch")

    # Colour per distinct first-dimension slice, in order of first appearance.
    slice_colour: dict[tuple[int, int] | None, str] = {}
    holders: dict[tuple[int, int] | None, int] = {}
    for shard in shards:
        index = shard.get("index") or []
        key = (int(index[0][0]), int(index[0][1])) if index else None
        if key not in slice_colour:
            slice_colour[key] = _colour(len(slice_colour))
        holders[key] = holders.get(key, 0) + 1

    width = LEFT + cols_drawn * (CELL_W + GAP) + MARGIN
    legend_rows = min(len(slice_colour), MAX_LEGEND) + (1 if len(slice_colour) > MAX_LEGEND else 0)
    grid_bottom = TOP + rows_drawn * (CELL_H + GAP)
    height = grid_bottom + 40 + 18 * (legend_rows + 2) + MARGIN
    width = max(width, 520)

    title = plan.get("name") or plan.get("id", "mesh plan")
    shape_text = " x ".join(f"{k}={v}" for k, v in axes.items())
    kind = "live" if plan.get("live") else "abstract"
    out: list[str] = [
        "<?xml version='1.0' encoding='UTF-8'?>",
        f"<svg xmlns='http://www.w3.org/2000/svg' version='1.1' width='{width}' "
        f"height='{height}' viewBox='0 0 {width} {height}'>",
        f"<title>{escape(f'{title}: {shape_text} ({n} devices)')}</title>",
        f"<rect x='0' y='0' width='{width}' height='{height}' fill='#ffffff'/>",
        _t(MARGIN, 22, f"{title}", size=15, anchor="start", extra="font-weight='bold'"),
        _t(
            MARGIN,
            40,
            f"mesh {shape_text}, {n} devices, {kind}, platform {plan.get('platform') or '-'}",
            anchor="start",
        ),
    ]
    if rows_drawn * cols_drawn < n:
        out.append(
            _t(
                MARGIN,
                56,
                f"showing {rows_drawn * cols_drawn} of {n} devices "
                f"(first {rows_drawn} rows x {cols_drawn} columns)",
                anchor="start",
                extra="fill='#b00020'",
            )
        )

    # Axis labels on the edges.
    if len(sizes) == 1 and not wrapped:
        col_axis, row_axis = names[0], None
    elif len(sizes) == 1:
        col_axis, row_axis = f"{names[0]} (mod {WRAP_1D})", f"{names[0]} (div {WRAP_1D})"
    else:
        col_axis, row_axis = names[-1], " x ".join(names[:-1])
    grid_right = LEFT + cols_drawn * (CELL_W + GAP)
    out.append(_t((LEFT + grid_right) / 2, TOP - 22, f"{col_axis} \u2192", size=12))
    for c in range(cols_drawn):
        out.append(_t(LEFT + c * (CELL_W + GAP) + CELL_W / 2, TOP - 6, str(c), size=10))
    if row_axis is not None:
        mid = (TOP + grid_bottom) / 2
        out.append(
            _t(14, mid, f"{row_axis} \u2193", size=12, extra=f"transform='rotate(-90 14 {mid})'")
        )
    lead_sizes = sizes[:-1] if len(sizes) > 1 else []
    for r in range(rows_drawn):
        if len(sizes) == 1:
            label = "" if not wrapped else str(r)
        else:
            rem, coord = r, []
            for size in reversed(lead_sizes):
                coord.append(rem % size)
                rem //= size
            label = ",".join(str(c) for c in reversed(coord))
        if label:
            out.append(_t(LEFT - 8, TOP + r * (CELL_H + GAP) + CELL_H / 2 + 4, label, anchor="end"))

    # Cells: mesh position p = row * cols + col (row-major, as the shards are ordered).
    for r in range(rows_drawn):
        for c in range(cols_drawn):
            p = r * cols + c
            if p >= n:
                break
            shard = shards[p]
            index = shard.get("index") or []
            key = (int(index[0][0]), int(index[0][1])) if index else None
            x = LEFT + c * (CELL_W + GAP)
            y = TOP + r * (CELL_H + GAP)
            coords = shard.get("coords") or {}
            coord_text = "(" + ",".join(str(coords.get(a, "?")) for a in names) + ")"
            tip = f"device {shard.get('device')} {coord_text}"
            if index:
                tip += f" batch[{key[0]}:{key[1]}] replica {shard.get('replica')}"
            out.append(
                f"<g><title>{escape(tip)}</title>"
                f"<rect x='{x}' y='{y}' width='{CELL_W}' height='{CELL_H}' rx='4' "
                f"fill='{slice_colour[key]}' stroke='#333333' stroke-width='1'/>"
                + _t(x + CELL_W / 2, y + 18, f"{shard.get('device')}", size=13)
                + _t(x + CELL_W / 2, y + 34, coord_text, size=9)
                + "</g>"
            )

    # Legend.
    y = grid_bottom + 28
    if batch:
        spec0 = batch.get("spec", [None])[0]
        split = (
            "replicated"
            if spec0 is None
            else f"split over {spec0 if isinstance(spec0, str) else ' x '.join(spec0)}"
        )
        heading = f"batch {batch.get('shape')} dim 0 {split}; colour = slice of dim 0"
    else:
        heading = "no batch_shape: every device holds the same (empty) slice"
    out.append(_t(MARGIN, y, heading, anchor="start", extra="font-weight='bold'"))
    for i, (key, colour) in enumerate(slice_colour.items()):
        if i >= MAX_LEGEND:
            out.append(
                _t(
                    MARGIN,
                    y + 18 * (i + 1) + 4,
                    f"... {len(slice_colour) - i} more",
                    anchor="start",
                )
            )
            break
        ly = y + 18 * (i + 1)
        text = "whole batch" if key is None else f"[{key[0]}, {key[1]})"
        out.append(
            f"<rect x='{MARGIN}' y='{ly - 8}' width='14' height='12' fill='{colour}' "
            f"stroke='#333333'/>"
        )
        out.append(
            _t(MARGIN + 22, ly + 2, f"{text}: {holders[key]} device(s)", anchor="start", size=11)
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"
