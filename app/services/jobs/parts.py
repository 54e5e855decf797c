"""The merge rules of multi-source parts: when a part is a retry, when it conflicts, when a
step is complete, and how a completed step's parts merge into one point.

A job whose hosts each push their own devices' metrics (``sources > 1``) sends, per host
and batch, one :class:`~app.storage.parts.PartSegment`. :func:`push_segment` decides what
becomes of it, reading and writing through the :class:`~app.storage.parts.SegmentTable`
that storage hands it inside the push's write transaction (SQLite's write lock serialises
pushes, so two hosts completing the same step cannot both merge it):

- a step given twice in the segment must be given the same (else 409 ``step_conflict``);
- a step this source stored before is a retry when its content hash matches (a no-op),
  else 409 ``step_conflict``;
- every part of a step gives the same ``sources`` (else 409 ``sources_mismatch``), the
  same metrics and device count (else 409 ``part_mismatch``); a step with all its sources
  takes no new one (409 ``step_conflict``);
- the push that brings a step's last part merges every source's parts of it
  (:func:`merge_rows`, sources in natural order of their names) as one push of every
  device.

Storage keeps the rows (:mod:`app.storage.parts`); this module keeps the rules, so the
job push is decoded, merged and checked in the jobs service and only stored by storage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import orjson

from app.codecs.json_arrays import encode_json
from app.core.errors import PartMismatch, SourcesMismatch, StepConflict, from_library
from app.services.jobs.spread import Spread, spread_rows
from app.storage.part_blobs import row_hashes
from app.storage.parts import (
    WEIGHTS_ARRAY,
    MergedStep,
    OpenHolder,
    PartSegment,
    SegmentPush,
    SegmentTable,
    source_order,
)
from app.storage.reduced_text import object_texts, scalar_floats
from datarax.errors import MetricsError
from datarax.metrics.merge import merge_steps
from datarax.tree_types import NanPolicy, ReduceOp

type PartsOfSteps = list[tuple[str, dict[str, np.ndarray]]]
"""The parts of k steps, ``[(source, {name: [k, n_devices, ...]})]``, in source order."""

MergeRows = Callable[[PartsOfSteps, str], list[MergedStep]]
"""Merges the parts of k steps and their signature (reduce options) into k points
(:func:`merge_rows`)."""


def signature_options(signature: str) -> tuple[dict[str, ReduceOp], NanPolicy]:
    """(reduce ops, NaN policy) of a part signature (JSON: metrics, reduce, nan_policy), as
    the library's types: the push that stored it had them checked by the library."""
    meta = orjson.loads(signature)
    return cast("dict[str, ReduceOp]", meta["reduce"]), cast("NanPolicy", meta["nan_policy"])


def merge_rows(parts: PartsOfSteps, signature: str) -> list[MergedStep]:
    """Merges k steps' parts (``[(source, {name: [k, n_devices, ...]})]``, source order)
    exactly as one push of every device, with the library's pure
    :func:`datarax.metrics.merge.merge_steps`; the points' text as a batch of
    complete steps stores it (:func:`app.storage.reduced_text.object_texts`).

    Raises:
      ServiceError: the library's metric codes.
    """
    ops, nan_policy = signature_options(signature)
    metrics = [{n: a for n, a in arrays.items() if n != WEIGHTS_ARRAY} for _, arrays in parts]
    weights = [arrays.get(WEIGHTS_ARRAY) for _, arrays in parts]
    try:
        merged = merge_steps(metrics, ops, weights=weights, nan_policy=nan_policy)
    except MetricsError as err:
        raise from_library(err) from None
    count = len(parts[0][1][next(iter(parts[0][1]))]) if parts and parts[0][1] else 0
    spreads = merged_spreads(metrics, count)
    if merged.columns is not None:
        names = list(merged.columns)
        columns = [merged.columns[n] for n in names]
        texts = object_texts(names, columns)
        rows = zip(*(column.tolist() for column in columns), strict=True)
        return [
            MergedStep(text, dict(zip(names, row, strict=True)), merged.num_devices, spread)
            for text, row, spread in zip(texts, rows, spreads, strict=True)
        ]
    return [
        MergedStep(
            encode_json(reduced).decode(), scalar_floats(reduced), merged.num_devices, spread
        )
        for reduced, spread in zip(merged.reduced, spreads, strict=True)
    ]


def merged_spreads(metrics: Sequence[Mapping[str, np.ndarray]], steps: int) -> list[Spread | None]:
    """The spread of each of ``steps`` steps over the devices of every source, in source
    order (each source's metrics ``[steps, n_devices, ...]``; metrics of one number per
    step have none)."""
    first = metrics[0] if metrics else {}
    joined = {
        name: np.concatenate([np.asarray(source[name]) for source in metrics], axis=1)
        for name, array in first.items()
        if np.ndim(array) >= 2
    }
    return spread_rows(joined, steps) if joined and steps else [None] * steps


def unique_rows(segment: PartSegment, hashes: np.ndarray) -> np.ndarray:
    """Positions of the segment's first part of each step, in step order. A step given
    twice must be given the same (a retry inside one push); else 409 ``step_conflict``."""
    steps = np.asarray(segment.steps, dtype=np.int64)
    if steps.size < 2 or bool((steps[1:] > steps[:-1]).all()):
        return np.arange(steps.size)  # ascending, each step once (the usual push)
    order = np.argsort(steps, kind="stable")
    ordered = steps[order]
    repeat = np.flatnonzero(ordered[1:] == ordered[:-1]) + 1
    for i in repeat.tolist():
        if hashes[order[i]] != hashes[order[i - 1]]:
            step = int(ordered[i])
            raise StepConflict(
                f"{segment.where(step)}: the batch holds this step twice, differently"
            )
    keep = np.ones(ordered.size, dtype=bool)
    keep[repeat] = False
    return order[keep]


def _retried(
    table: SegmentTable, segment: PartSegment, steps: np.ndarray, hashes: np.ndarray
) -> np.ndarray:
    """Which of ``steps`` this source stored before with the same content (a retry).

    Raises:
      StepConflict: one it stored with other content (or other sources or signature).
    """
    retried = np.zeros(steps.size, dtype=bool)
    for stored in table.own_segments(segment.source, int(steps[0]), int(steps[-1])):
        common, ours, theirs = np.intersect1d(
            steps, stored.steps, assume_unique=True, return_indices=True
        )
        if not common.size:
            continue
        known = stored.hashes[theirs]
        differs = (known != hashes[ours]) & (known != 0)  # 0: migrated without its arrays
        if (
            stored.signature != segment.signature
            or stored.sources != segment.sources
            or differs.any()
        ):
            step = int(common[int(np.argmax(differs))] if differs.any() else common[0])
            raise StepConflict(
                f"{segment.where(step)}: this source's part of step {step} is stored with "
                "other content; parts are written once (a retry must send the same content)"
            )
        retried[ours] = True
    return retried


def _check_complete_steps(
    table: SegmentTable,
    segment: PartSegment,
    fresh_steps: set[int],
    stored_points: dict[int, tuple[int, str, str]],
) -> None:
    """Refuses a part of a step already complete, unless it is this source's retry.

    Raises:
      SourcesMismatch: the complete step has another ``sources``.
      StepConflict: a new source for a step that has all its sources.
    """
    for step, stored_point in stored_points.items():
        if stored_point[0] != segment.sources:
            raise SourcesMismatch(
                f"{segment.where(step)}: sources={segment.sources}, but the step has "
                f"sources={stored_point[0]}; every part of a step must give the same number "
                "of sources"
            )
    joining = sorted(fresh_steps & stored_points.keys())
    if joining:
        step = joining[0]
        raise StepConflict(
            f"{segment.where(step)}: step {step} already has all {segment.sources} "
            f"sources ({table.step_sources(step)}); a new source cannot join it"
        )


def _check_other_sources(table: SegmentTable, segment: PartSegment, new_steps: np.ndarray) -> None:
    """Refuses new parts whose step's other parts (open segments of other sources) give
    other ``sources``, metrics or device count. The query returns the disagreeing
    segments only: usually none, whatever the number of hosts.

    Raises:
      SourcesMismatch, PartMismatch: as their names say.
    """
    for other in table.disagreeing_segments(segment, int(new_steps[0]), int(new_steps[-1])):
        common = np.intersect1d(new_steps, other.steps, assume_unique=True)
        if not common.size:
            continue
        step = int(common[0])
        if other.sources != segment.sources:
            raise SourcesMismatch(
                f"{segment.where(step)}: sources={segment.sources}, but the step has "
                f"sources={other.sources}; every part of a step must give the same number "
                "of sources"
            )
        raise PartMismatch(
            f"{segment.where(step)}: the part has {segment.num_devices} devices and "
            f"metrics {segment.signature}, the step's other parts {other.num_devices} "
            f"devices and {other.signature}; every source must push the same metrics for as "
            "many devices"
        )


def _count_sources(table: SegmentTable, segment: PartSegment, new_steps: np.ndarray) -> np.ndarray:
    """Adds this source to its new steps' coverage; which of them are now complete.

    Raises:
      StepConflict: a step that already had all its sources.
    """
    count = table.add_coverage(new_steps)
    if (count > segment.sources).any():
        step = int(new_steps[int(np.argmax(count > segment.sources))])
        raise StepConflict(
            f"{segment.where(step)}: step {step} already has all {segment.sources} sources "
            f"({table.step_sources(step)}); a new source cannot join it"
        )
    return count == segment.sources


def push_segment(
    table: SegmentTable,
    segment: PartSegment,
    now: str,
    stored_points: dict[int, tuple[int, str, str]],
    merge: MergeRows = merge_rows,
) -> SegmentPush:
    """Stores one source's parts through ``table`` (inside the push's transaction) and
    merges the steps they complete.

    Args:
      table: the segments of the job, as storage hands them to the rules.
      segment: the parts, as the service decoded them.
      now: the push's time (RFC 3339 UTC).
      stored_points: ``step -> (sources, reduced, received_at)`` of the complete steps
        among the segment's.
      merge: how completed steps' parts merge (:func:`merge_rows`).

    Returns:
      What the push stored, which of its steps are complete, and the points it completed.

    Raises:
      StepConflict: this source's part of a step stored with other content; a step that
        already has all its sources; a step given twice, differently.
      SourcesMismatch: ``sources`` differs from the step's.
      PartMismatch: metrics or device count differ from the step's other parts.
    """
    names = sorted(segment.columns)
    hashes = row_hashes([segment.columns[n] for n in names])
    rows = unique_rows(segment, hashes)
    steps = np.asarray(segment.steps, dtype=np.int64)[rows]
    hashes = hashes[rows]
    fresh_mask = ~_retried(table, segment, steps, hashes)
    fresh_steps = set(steps[fresh_mask].tolist()) if stored_points else set()
    _check_complete_steps(table, segment, fresh_steps, stored_points)
    complete = {step: (point[1], point[2]) for step, point in stored_points.items()}
    fresh = np.flatnonzero(fresh_mask)
    if not fresh.size:
        return SegmentPush(received_at=now, complete=complete)
    new_steps = steps[fresh]
    _check_other_sources(table, segment, new_steps)
    done = _count_sources(table, segment, new_steps)
    columns = {n: np.ascontiguousarray(segment.columns[n][rows[fresh]]) for n in segment.columns}
    pending = int(new_steps.size - done.sum())
    table.insert_segment(segment, new_steps, hashes[fresh], columns, pending, now)
    created = frozenset(new_steps.tolist())
    if not done.any():
        return SegmentPush(received_at=now, complete=complete, created_steps=created)
    # Completing steps: the segments that hold their other parts (all agree, checked above).
    holders = table.open_holders(segment.source, int(new_steps[0]), int(new_steps[-1]))
    completed = merge_completed(table, segment, new_steps[done], columns, done, holders, merge)
    for step, point in completed:
        complete[step] = (point.reduced, now)
    return SegmentPush(
        received_at=now, complete=complete, created_steps=created, completed=tuple(completed)
    )


def _groups(
    holders: Sequence[OpenHolder], complete: np.ndarray
) -> tuple[list[tuple[OpenHolder, np.ndarray]], dict[bytes, list[int]]]:
    """The holders of the completed steps (each with where each step sits in it, -1: not
    held), and the steps grouped by which holders hold them (usually one group: every
    host pushes the same steps)."""
    found: list[tuple[OpenHolder, np.ndarray]] = []
    for holder in holders:
        their_steps = holder.steps
        at = np.searchsorted(their_steps, complete)
        at[at >= their_steps.size] = 0
        hit = their_steps[at] == complete if their_steps.size else np.zeros(0, bool)
        if hit.any():
            found.append((holder, np.where(hit, at, -1)))
    member = np.array([at >= 0 for _, at in found]).reshape(len(found), complete.size)
    groups: dict[bytes, list[int]] = {}
    if member.all():  # every holder holds every step: one group
        groups[member[:, 0].tobytes() if complete.size else b""] = list(range(complete.size))
    else:
        for j in range(complete.size):
            groups.setdefault(member[:, j].tobytes(), []).append(j)
    return found, groups


def merge_completed(
    table: SegmentTable,
    segment: PartSegment,
    complete: np.ndarray,
    columns: dict[str, np.ndarray],
    done: np.ndarray,
    holders: Sequence[OpenHolder],
    merge: MergeRows,
) -> list[tuple[int, MergedStep]]:
    """Merges the ``complete`` steps (``done`` marks them among the segment's new rows,
    ``columns``): their parts from every segment holding them, and counts them down in
    those segments.

    Returns:
      ``(step, merged point)`` of each completed step.
    """
    ours = np.flatnonzero(done)
    found, groups = _groups(holders, complete)
    # Every holder's arrays in one query, not one a holder (64 hosts: 63 queries); each
    # holder holds at least one completed step, so each is in some group.
    loaded = table.arrays_of([holder.id for holder, _ in found])
    counts: dict[int, int] = {}
    out: list[tuple[int, MergedStep]] = []
    for key, members in groups.items():
        which = np.frombuffer(key, dtype=bool)
        pick = np.asarray(members, dtype=np.int64)
        parts = [(segment.source, {n: c[ours[pick]] for n, c in columns.items()})]
        for h in np.flatnonzero(which).tolist():
            holder, at = found[h]
            rows = at[pick]
            parts.append((holder.source, {n: a[rows] for n, a in loaded[holder.id].items()}))
            counts[holder.id] = counts.get(holder.id, 0) + len(members)
        parts.sort(key=lambda part: source_order(part[0]))
        merged = merge(parts, segment.signature)
        steps = complete[pick].tolist()
        if len(merged) != len(steps):
            raise RuntimeError(f"a merge gave {len(merged)} points for {len(steps)} steps")
        out += zip(steps, merged)  # noqa: B905 (lengths checked above)
    table.count_down(counts)
    return out


@dataclass(frozen=True)
class PartRules:
    """The rules storage runs on each segment of a push, inside its transaction
    (:data:`app.storage.parts.SegmentRules`); ``merge`` merges completed steps."""

    merge: MergeRows = merge_rows

    def __call__(
        self,
        table: SegmentTable,
        segment: PartSegment,
        now: str,
        stored_points: dict[int, tuple[int, str, str]],
    ) -> SegmentPush:
        return push_segment(table, segment, now, stored_points, self.merge)


PART_RULES = PartRules()
"""The rules every push uses: the library's merge."""
