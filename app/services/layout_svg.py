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

import colorsys
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from app.core.errors import InvalidParameter

MAX_CELLS = 256
MAX_COLUMNS = 32
MAX_BLOCKS = 64
BLOCK_COLUMNS = 8
WRAP = 16
WRAP_1D = WRAP
MAX_LEGEND = 16
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
MIXED = "#d9d9d9"
SCOPE_PARAMS = ("slice", "host", "process", "positions")
_RANGE = re.compile(r"^(\d{1,9})(?:-(\d{1,9}))?$")

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
    """The font size, at most ``size``, at which ``text`` fits in ``width`` px (at least
    :data:`MIN_FONT`: longer text is cut by :func:`_clip` instead of shrunk)."""
    return max(MIN_FONT, min(size, int((width - 6) / (max(len(text), 1) * CHAR_W))))


def _clip(text: str, width: int, size: int) -> str:
    """``text`` cut with an ellipsis to fit ``width`` px at ``size``."""
    room = max(1, int((width - 6) / (size * CHAR_W)))
    return text if len(text) <= room else text[: room - 1] + "\u2026"


def _text_width(text: str, size: int) -> float:
    return len(text) * size * CHAR_W


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 device``, ``2 devices``, ``65,536 devices``."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def format_rate(bytes_per_s: float) -> str:
    """Bytes per second with SI prefixes, 3 significant digits: ``6.25 GB/s`` (the
    dashboard's ``rate()`` writes the same text)."""
    v = float(bytes_per_s)
    for unit in ("B/s", "kB/s", "MB/s", "GB/s", "TB/s"):
        if abs(v) < 1000 or unit == "TB/s":
            return f"{float(f'{v:.3g}'):g} {unit}"
        v /= 1000
    raise AssertionError("unreachable")


def _span(lo: Any, hi: Any) -> str:
    return str(lo) if lo == hi else f"{lo}\u2013{hi}"


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
    href: str | None = None


@dataclass
class _Colours:
    """Batch slice -> fill colour, categorical for few slices, a ramp for many."""

    keys: Mapping[tuple[int, int] | None, int]  # slice -> number of holders, first-seen order
    low: int  # the ramp's ends: the batch rows of the scope drawn
    high: int
    categorical: bool = field(init=False)
    table: dict[tuple[int, int] | None, str] = field(init=False)

    def __post_init__(self) -> None:
        self.categorical = len(self.keys) <= MAX_LEGEND
        # Categorical colours follow first appearance; ramp colours are made on demand.
        self.table = {k: _palette(i) for i, k in enumerate(self.keys)} if self.categorical else {}

    def colour(self, key: tuple[int, int] | None) -> str:
        if key not in self.table:
            start = (key[0] if key else 0) - self.low
            self.table[key] = _ramp(start / max(self.high - self.low - 1, 1))
        return self.table[key]

    def of(self, keys: Sequence[tuple[int, int] | None]) -> str:
        """The fill of a cell holding these slices (a block may hold several)."""
        distinct = set(keys)
        if len(distinct) == 1 or not self.categorical:
            return self.colour(min(distinct, key=lambda k: k or (0, 0)))
        return MIXED


# ------------------------------------------------------------------------------ scope


def parse_scope(params: Mapping[str, str | None]) -> dict[str, tuple[int, int]]:
    """``{"slice": "3", "positions": "0-1023"}`` -> ``{"slice": (3, 3), "positions": (0,
    1023)}``; absent or empty values are left out.

    Raises:
      InvalidParameter: a value that is not ``N`` or ``N-M`` with ``N <= M`` (422
        ``validation_error``, naming the query parameter).
    """
    scope: dict[str, tuple[int, int]] = {}
    for name in SCOPE_PARAMS:
        value = params.get(name)
        if value is None or value == "":
            continue
        match = _RANGE.match(value)
        if not match:
            raise InvalidParameter(
                ("query", name), f"{value!r} is not a number N or a range N-M, e.g. 3 or 0-3"
            )
        lo = int(match.group(1))
        hi = int(match.group(2)) if match.group(2) is not None else lo
        if hi < lo:
            raise InvalidParameter(("query", name), f"the range {value!r} ends before it starts")
        scope[name] = (lo, hi)
    return scope


def _scope_query(scope: Mapping[str, tuple[int, int]]) -> str:
    parts = []
    for k in SCOPE_PARAMS:
        if k in scope:
            lo, hi = scope[k]
            parts.append(f"{k}={lo}" if lo == hi else f"{k}={lo}-{hi}")
    return "&".join(parts)


def _select(shards: Sequence[Mapping[str, Any]], scope: Mapping[str, tuple[int, int]]):
    """The positions (mesh order) of the devices in ``scope``."""
    n = len(shards)
    lo, hi = scope.get("positions", (0, n - 1))
    positions = range(max(lo, 0), min(hi, n - 1) + 1)
    keyed = [(k, "process_index" if k == "process" else k) for k in ("slice", "host", "process")]
    tests = [(field_, scope[k]) for k, field_ in keyed if k in scope]
    if not tests:
        return list(positions)
    out = []
    for p in positions:
        shard = shards[p]
        for field_, (a, b) in tests:
            v = shard.get(field_, 0 if field_ == "process_index" else None)
            if v is None or not a <= v <= b:
                break
        else:
            out.append(p)
    return out


def _scope_text(scope: Mapping[str, tuple[int, int]]) -> str:
    one = {"slice": "slice", "host": "host", "process": "process", "positions": "position"}
    many = {"slice": "slices", "host": "hosts", "process": "processes", "positions": "positions"}
    return ", ".join(
        f"{(one if scope[k][0] == scope[k][1] else many)[k]} {_span(*scope[k])}"
        for k in SCOPE_PARAMS
        if k in scope
    )


# ------------------------------------------------------------------------------ cells


def _grid_shape(sizes: Sequence[int]) -> tuple[int, int, bool]:
    """(rows, columns, wrapped) of the device grid over all devices."""
    n = math.prod(sizes)
    if len(sizes) == 1:
        if n > WRAP:
            return math.ceil(n / WRAP), WRAP, True
        return 1, n, False
    return n // sizes[-1], sizes[-1], False


def _row_labels(sizes: Sequence[int], wrapped: bool, rows: int) -> list[str]:
    """The label of each row of the whole-plan device grid: its leading coordinates."""
    if len(sizes) == 1:
        return [str(r) if wrapped else "" for r in range(rows)]
    labels = []
    for r in range(rows):
        rem, coord = r, []
        for size in reversed(sizes[:-1]):
            coord.append(rem % size)
            rem //= size
        labels.append(",".join(str(c) for c in reversed(coord)))
    return labels


def _axis_text(name: str, size: int, detail: Mapping[str, Mapping[str, Any]]) -> str:
    link = detail.get(name, {}).get("link")
    return f"{name}={size}" + (f" ({link})" if link else "")


def _device_cells(shards, positions, names, colours, cols) -> list[_Cell]:
    cells = []
    for i, p in enumerate(positions):
        shard = shards[p]
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
            _Cell(i // cols, i % cols, colours.of([key]), lines, tip, shard.get("slice"),
                  (shard.get("slice"), shard.get("host")) if "host" in shard else None)
        )  # fmt: skip
    return cells


def _slice_key(shard: Mapping[str, Any]) -> tuple[int, int] | None:
    index = shard.get("index") or []
    return (int(index[0][0]), int(index[0][1])) if index else None


@dataclass(frozen=True)
class _Unit:
    """How a scope splits into groups: the unit's words, its filter, each member's key."""

    word: str  # "slice"
    words: str  # "slices"
    param: str  # the scope filter a block of this unit sets
    keys: list[Any]  # per member position: an int group key (for positions units: the row)


def _block_unit(shards, positions, names, sizes) -> _Unit:
    """The first unit that splits the scope into more than one group."""
    first = shards[positions[0]]
    for field_, word, words, param in (
        ("slice", "slice", "slices", "slice"),
        ("host", "host", "hosts", "host"),
        ("process_index", "process", "processes", "process"),
    ):
        if field_ == "process_index" and "host" in first:
            continue  # hardware plans: a host is a process
        if field_ not in first and field_ != "process_index":
            continue
        keys = [int(shards[p].get(field_, 0)) for p in positions]
        if len(set(keys)) > 1:
            return _Unit(word, words, param, keys)
    # Rows of the shortest prefix of the mesh axes that splits the scope (row-major, so a
    # row is a contiguous range of positions).
    for k in range(1, len(sizes)):
        trailing = math.prod(sizes[k:])
        keys = [p // trailing for p in positions]
        if keys[0] != keys[-1]:
            lead = names[:k]
            word = lead[0] if k == 1 else "(" + ",".join(lead) + ")"
            return _Unit(f"row of {word}", f"rows of {word}", "positions", keys)
    chunk = math.ceil(len(positions) / MAX_BLOCKS)
    return _Unit("run", "runs", "positions", [i // chunk for i in range(len(positions))])


def _row_name(unit: _Unit, sizes: Sequence[int], row: int) -> str:
    """The leading coordinates of a row: ``data=5`` or ``(data,fsdp)=(5,3)``."""
    word = unit.word.removeprefix("row of ")
    k = 1 if not word.startswith("(") else word.count(",") + 1
    coord, rem = [], row
    for size in reversed(sizes[:k]):
        coord.append(rem % size)
        rem //= size
    coord.reverse()
    return f"{word}={coord[0]}" if k == 1 else f"{word}=(" + ",".join(map(str, coord)) + ")"


def _block_cells(shards, positions, slice_keys, names, sizes, colours, scope):
    """Blocks of the scope: (how they were made, the cells)."""
    unit = _block_unit(shards, positions, names, sizes)
    members: dict[Any, list[int]] = {}
    for p, key in zip(positions, unit.keys, strict=True):
        members.setdefault(key, []).append(p)
    keys = sorted(members)
    merge = math.ceil(len(keys) / MAX_BLOCKS)
    groups = [keys[i : i + merge] for i in range(0, len(keys), merge)]
    cols = min(BLOCK_COLUMNS, max(1, math.ceil(math.sqrt(len(groups)))))
    cells = []
    for b, group in enumerate(groups):
        pos = [p for key in group for p in members[key]]
        held = [slice_keys[p] for p in pos]
        distinct = set(held)
        lo = min((k[0] for k in distinct if k), default=None)
        hi = max((k[1] for k in distinct if k), default=None)
        first = shards[pos[0]]
        if unit.param == "positions":
            span = (min(pos), max(pos))
            if unit.word == "run":
                name = f"positions {_span(*span)}"
            else:
                a, z = _row_name(unit, sizes, group[0]), _row_name(unit, sizes, group[-1])
                name = a if a == z else f"{a}\u2013{z.split('=', 1)[1]}"
        else:
            span = (group[0], group[-1])
            label = unit.word if len(group) == 1 else unit.words
            name = f"{label} {_span(*span)}"
            if unit.param == "host" and "slice" in first and "slice" not in scope:
                name = f"s{first['slice']} {name}"
        hosts = (
            {shards[p]["host"] for p in pos} if "host" in first and unit.param != "host" else set()
        )
        counts = [plural(len(pos), "device")]
        if len(hosts) > 1:
            counts.append(plural(len(hosts), "host"))
        batch_text = f"batch [{lo}, {hi})" if lo is not None else "whole batch"
        tip = (
            f"{name}: {plural(len(pos), 'device')} (positions {min(pos)}..{max(pos)} in mesh order)"
        )
        if len(hosts) > 1:
            tip += f", {plural(len(hosts), 'host')}"
        tip += f", {batch_text}, {plural(len(distinct), 'distinct slice')}; click to open"
        sub = {**scope, unit.param: span}
        slices = {shards[p].get("slice") for p in pos}
        cells.append(
            _Cell(b // cols, b % cols, colours.of(held), [name, *counts, batch_text], tip,
                  min(slices, key=str) if len(slices) == 1 else tuple(sorted(slices, key=str)),
                  (first.get("slice"), first["host"]) if unit.param == "host" else None,
                  "?" + _scope_query(sub))
        )  # fmt: skip
    how = unit.words if merge == 1 else f"{merge} {unit.words} each"
    if unit.word == "run":
        how = f"runs of {math.ceil(len(positions) / MAX_BLOCKS):,} devices"
    return f"one per {unit.word}" if merge == 1 and unit.word != "run" else how, cells


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


# ------------------------------------------------------------------------------ picture


def render_layout_svg(
    plan: Mapping[str, Any], scope: Mapping[str, tuple[int, int]] | None = None
) -> str:
    """The SVG text for a stored plan (the dict of ``GET /v1/meshes/{id}``).

    Args:
      plan: the stored plan JSON; hardware fields (``axes_detail``, per-shard ``slice``,
        ``host``, ``physical``) are drawn when present and optional otherwise.
      scope: the devices to draw (see :func:`parse_scope`); None or empty: all of them.

    Returns:
      A standalone SVG document, about 1,200 x 900 px at most for block pictures.

    Raises:
      InvalidParameter: the scope selects no device of this plan (422 ``validation_error``
        naming the first filter, with the plan's ranges in the message).
    """
    scope = dict(scope or {})
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

    positions = _select(shards, scope) if scope else list(range(n))
    if scope and not positions:
        name = next(k for k in SCOPE_PARAMS if k in scope)
        slices = plan.get("slices")
        hint = f"this plan has {plural(n, 'device')} (positions 0-{n - 1})"
        if slices:
            hint += f", slices 0-{int(slices) - 1}"
        if plan.get("hosts"):
            hint += f", hosts 0-{int(plan['hosts']) - 1}"
        raise InvalidParameter(("query", name), f"{_scope_text(scope)} selects no device; {hint}")

    # The ramp spans the batch rows of the scope: a slice of a pod is not one flat colour.
    low, high = 0, batch_size
    if scope and batch_size:
        held = [k for k in {slice_keys[p] for p in positions} if k]
        low, high = min(k[0] for k in held), max(k[1] for k in held)
    colours = _Colours(holders, low, high)

    whole_grid = not scope
    rows, cols, wrapped = _grid_shape(sizes)
    blocks = len(positions) > MAX_CELLS or (whole_grid and cols > MAX_COLUMNS)
    how = ""
    if blocks:
        how, cells = _block_cells(shards, positions, slice_keys, names, sizes, colours, scope)
        most = max(len(c.lines) for c in cells)
        w, h, left = BLOCK_W, BLOCK_H + PITCH * max(0, most - 3), MARGIN
    elif whole_grid:
        cells = _device_cells(shards, positions, names, colours, cols)
        row_labels = _row_labels(sizes, wrapped, max(c.row for c in cells) + 1)
        widest = max((_text_width(t, 11) for t in row_labels), default=0)
        w, h, left = CELL_W, CELL_H, math.ceil(MARGIN + widest + 14)
    else:
        wrap = sizes[-1] if sizes[-1] <= MAX_COLUMNS else WRAP
        cells = _device_cells(shards, positions, names, colours, min(wrap, len(positions)))
        w, h, left = CELL_W, CELL_H, MARGIN
    grid_rows = max((c.row for c in cells), default=-1) + 1
    grid_cols = max((c.col for c in cells), default=-1) + 1

    # Header: one line per text, so nothing overlaps.
    title = str(plan.get("name") or plan.get("id", "mesh plan"))
    shape_text = " x ".join(_axis_text(k, v, detail) for k, v in axes.items())
    kind = "live" if plan.get("live") else "abstract"
    header: list[tuple[str, int, str]] = [
        (title, 15, "font-weight='bold'"),
        (f"mesh {shape_text}, {plural(n, 'device')}, {kind}, "
         f"platform {plan.get('platform') or '-'}", 12, ""),
    ]  # fmt: skip
    for a, d in detail.items():
        rate = f", {format_rate(d['bytes_per_s'])}" if d.get("bytes_per_s") else ""
        header.append(
            (f"axis {a}: {d.get('link', '?')}, ici={d.get('ici', '?')} "
             f"dcn={d.get('dcn', '?')}{rate}", 12, "")
        )  # fmt: skip
    if scope:
        header.append(
            (f"showing {_scope_text(scope)}: {len(positions):,} of {plural(n, 'device')}", 12,
             "font-weight='bold'")
        )  # fmt: skip
    if blocks:
        header.append(
            (f"{plural(len(positions), 'device')} drawn as {plural(len(cells), 'block')} "
             f"({how}); click a block to open it", 12, "fill='#b00020'")
        )  # fmt: skip
    elif whole_grid:
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
        header.append((f"columns \u2192 {col_axis}", 12, ""))
        if row_axis:
            header.append((f"rows \u2193 {row_axis}", 12, ""))
    else:
        header.append(("devices in mesh order, left to right", 12, ""))

    out: list[str] = []
    y = 8.0
    for text, size, extra in header:
        y += size + 7
        out.append(_t(MARGIN, y, text, size=size, anchor="start", extra=extra))
    top = y + (26 if whole_grid and not blocks else 12)
    if whole_grid and not blocks:
        for c in range(grid_cols):
            out.append(_t(left + c * (w + GAP) + w / 2, top - 8, str(c), size=MIN_FONT))
        for r, label in enumerate(row_labels):
            if label:
                out.append(_t(left - 8, top + r * (h + GAP) + h / 2 + 4, label, anchor="end"))

    for cell in cells:
        x = left + cell.col * (w + GAP)
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
        shown = {slice_keys[p] for p in positions}
        for key, colour in colours.table.items():
            if key not in shown:
                continue
            y += LINE
            text = "whole batch" if key is None else f"[{key[0]}, {key[1]})"
            text = f"{text}: {plural(holders[key], 'device')}"
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
        legend.append(_t(MARGIN, y + 14, str(low), size=MIN_FONT, anchor="start"))
        legend.append(_t(MARGIN + 240, y + 14, str(high), size=MIN_FONT, anchor="end"))
        y += LINE + 8
        each = next(iter(holders.values()))
        text = (
            f"continuous ramp over the start row of each slice ({len(holders):,} distinct "
            f"slices of dim 0, {plural(each, 'device')} each)"
            if len(set(holders.values())) == 1
            else f"continuous ramp over the start row of each slice ({len(holders):,} slices)"
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
        text = "block: what it holds, its devices (and hosts), the batch rows it holds"
        legend.append(_t(MARGIN, y, text, anchor="start"))
        widths.append(_text_width(text, 11))
    out.extend(legend)

    widths += [_text_width(text, size) for text, size, _ in header]
    width = math.ceil(
        max(left + grid_cols * (w + GAP), 520, MARGIN + max(widths, default=0)) + MARGIN
    )
    height = math.ceil(y + MARGIN)
    caption = f"{title}: {shape_text} ({plural(n, 'device')})"
    if scope:
        caption += f", {_scope_text(scope)}"
    head = [
        "<?xml version='1.0' encoding='UTF-8'?>",
        f"<svg xmlns='http://www.w3.org/2000/svg' xmlns:xlink='http://www.w3.org/1999/xlink' "
        f"version='1.1' width='{width}' height='{height}' viewBox='0 0 {width} {height}'>",
        f"<title>{escape(caption)}</title>",
        f"<rect x='0' y='0' width='{width}' height='{height}' fill='#ffffff'/>",
    ]
    return "\n".join(head + out + ["</svg>"]) + "\n"
