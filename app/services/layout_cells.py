"""The cells of a layout picture: one per device, or summary blocks of groups of devices,
and their colours (which slice of batch dimension 0 each holds).

Up to :data:`MAX_CELLS` devices are drawn one cell each; bigger scopes become at most
:data:`MAX_BLOCKS` blocks, one per slice, else host, else process, else row of the leading
mesh axes, else run of consecutive devices. :mod:`app.services.layout_svg` draws them.
"""

from __future__ import annotations

import colorsys
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from app.services.layout_scope import scope_query, span_text
from datarax.parallel.kinds import axes_where

MAX_CELLS = 256
MAX_COLUMNS = 32
MAX_BLOCKS = 64
BLOCK_COLUMNS = 8
WRAP = 16
WRAP_1D = WRAP
MAX_LEGEND = 16
MIXED = "#d9d9d9"

RAMP = [
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


def ramp(t: float) -> str:
    """The colour at ``t`` in [0, 1] on the viridis ramp."""
    t = min(max(t, 0.0), 1.0) * (len(RAMP) - 1)
    i = min(int(t), len(RAMP) - 2)
    f = t - i
    a, b = RAMP[i], RAMP[i + 1]
    return "#" + "".join(f"{round(x + (y - x) * f):02x}" for x, y in zip(a, b, strict=True))


def batch_rows(lo: int | None, hi: int | None) -> str:
    """What a device holds of the batch, as a reader says it: ``batch rows 0-201``
    (dimension 0's rows ``lo`` to ``hi - 1``, both included), ``batch row 7``, or
    ``whole batch`` (``lo`` ``None``)."""
    if lo is None or hi is None:
        return "whole batch"
    return f"batch row {lo}" if hi - lo == 1 else f"batch rows {lo}-{hi - 1}"


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 device``, ``2 devices``, ``65,536 devices``."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


@dataclass
class Cell:
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
class Colours:
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
            self.table[key] = ramp(start / max(self.high - self.low - 1, 1))
        return self.table[key]

    def of(self, keys: Sequence[tuple[int, int] | None]) -> str:
        """The fill of a cell holding these slices (a block may hold several)."""
        distinct = set(keys)
        if len(distinct) == 1 or not self.categorical:
            return self.colour(min(distinct, key=lambda k: k or (0, 0)))
        return MIXED


def grid_shape(sizes: Sequence[int]) -> tuple[int, int, bool]:
    """(rows, columns, wrapped) of the device grid over all devices."""
    n = math.prod(sizes)
    if len(sizes) == 1:
        if n > WRAP:
            return math.ceil(n / WRAP), WRAP, True
        return 1, n, False
    return n // sizes[-1], sizes[-1], False


def grid_row_labels(sizes: Sequence[int], wrapped: bool, rows: int) -> list[str]:
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


@dataclass(frozen=True)
class ModelSplit:
    """A dimension of the plan's model that its axes split: the routed experts over the
    expert axes, or the layers over the stage axes (``per`` a shard, ``repeats`` passes
    of a circular pipeline)."""

    what: str  # "experts" or "layers"
    axes: tuple[str, ...]
    sizes: tuple[int, ...]
    total: int
    per: int
    repeats: int = 1

    def header(self) -> str:
        over = " x ".join(f"{a}={n}" for a, n in zip(self.axes, self.sizes, strict=True))
        text = f"{over} splits the {self.total} {self.what}: {self.per} per device"
        return text + (f" in each of {self.repeats} passes" if self.repeats > 1 else "")

    def held(self, coords: Mapping[str, Any]) -> str:
        """``experts 4-5`` or ``layers 0-9, 40-49``: what the device at ``coords`` holds."""
        k = 0
        for a, n in zip(self.axes, self.sizes, strict=True):
            k = k * n + int(coords.get(a, 0))
        shards = math.prod(self.sizes)
        runs = [r * shards * self.per + k * self.per for r in range(self.repeats)]
        return f"{self.what} " + ", ".join(f"{lo}-{lo + self.per - 1}" for lo in runs)


def model_splits(plan: Mapping[str, Any]) -> list[ModelSplit]:
    """The model dimensions the plan's axes split (none without a stored model)."""
    model, axes = plan.get("model") or {}, plan.get("axes") or {}
    out = []
    pipeline = plan.get("pipeline") or {}
    for what, splits, total in (
        ("experts", attrgetter("splits_experts"), int(model.get("num_experts") or 0)),
        ("layers", attrgetter("splits_layers"), int(model.get("layers") or 0)),
    ):
        names = list(axes_where(axes, splits))
        shards = math.prod(int(axes[a]) for a in names)
        if not names or not total or total % shards:
            continue
        per = total // shards
        if what == "layers" and pipeline.get("layers_per_stage"):
            per = int(pipeline["layers_per_stage"])
        repeats = total // (shards * per) if total % (shards * per) == 0 else 1
        sizes = tuple(int(axes[a]) for a in names)
        out.append(ModelSplit(what, tuple(names), sizes, total, per, repeats))
    return out


def device_cells(
    shards: Sequence[Mapping[str, Any]],
    positions: Sequence[int],
    names: Sequence[str],
    colours: Colours,
    cols: int,
    splits: Sequence[ModelSplit] = (),
) -> list[Cell]:
    """One cell per device at ``positions``, ``cols`` to a row, labelled with its id, mesh
    coordinates and (hardware plans) slice and host; the experts or layers it holds in
    its tip (``splits``)."""
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
            tip += f" {batch_rows(key[0], key[1])} replica {shard.get('replica')}"
        if "physical" in shard:
            tip += f" physical {shard['physical']}"
            if "core" in shard:
                tip += f" core {shard['core']}"
        if where:
            tip += f" slice {shard.get('slice', '-')} host {shard.get('host', '-')}"
        for split in splits:
            tip += f"; {split.held(coords)}"
        cells.append(
            Cell(i // cols, i % cols, colours.of([key]), lines, tip, shard.get("slice"),
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


def _block_unit(
    shards: Sequence[Mapping[str, Any]],
    positions: Sequence[int],
    names: Sequence[str],
    sizes: Sequence[int],
) -> _Unit:
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


def block_cells(
    shards: Sequence[Mapping[str, Any]],
    positions: Sequence[int],
    slice_keys: Sequence[tuple[int, int] | None],
    names: Sequence[str],
    sizes: Sequence[int],
    colours: Colours,
    scope: Mapping[str, tuple[int, int]],
) -> tuple[str, list[Cell]]:
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
                name = f"positions {span_text(*span)}"
            else:
                a, z = _row_name(unit, sizes, group[0]), _row_name(unit, sizes, group[-1])
                name = a if a == z else f"{a}\u2013{z.split('=', 1)[1]}"
        else:
            span = (group[0], group[-1])
            label = unit.word if len(group) == 1 else unit.words
            name = f"{label} {span_text(*span)}"
            if unit.param == "host" and "slice" in first and "slice" not in scope:
                name = f"s{first['slice']} {name}"
        hosts = (
            {shards[p]["host"] for p in pos} if "host" in first and unit.param != "host" else set()
        )
        counts = [plural(len(pos), "device")]
        if len(hosts) > 1:
            counts.append(plural(len(hosts), "host"))
        batch_text = batch_rows(lo, hi)
        tip = (
            f"{name}: {plural(len(pos), 'device')} (positions {min(pos)}..{max(pos)} in mesh order)"
        )
        if len(hosts) > 1:
            tip += f", {plural(len(hosts), 'host')}"
        tip += f", {batch_text}, {plural(len(distinct), 'distinct slice')}; click to open"
        sub = {**scope, unit.param: span}
        slices = {shards[p].get("slice") for p in pos}
        cells.append(
            Cell(b // cols, b % cols, colours.of(held), [name, *counts, batch_text], tip,
                  min(slices, key=str) if len(slices) == 1 else tuple(sorted(slices, key=str)),
                  (first.get("slice"), first["host"]) if unit.param == "host" else None,
                  "?" + scope_query(sub))
        )  # fmt: skip
    how = unit.words if merge == 1 else f"{merge} {unit.words} each"
    if unit.word == "run":
        how = f"runs of {math.ceil(len(positions) / MAX_BLOCKS):,} devices"
    return f"one per {unit.word}" if merge == 1 and unit.word != "run" else how, cells
