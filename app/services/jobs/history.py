"""Reading a job's metric history: a page of steps, or downsampled buckets, as the JSON
bytes of a :class:`~datarax.answers.jobs.History`.

Memory and time per request: a page holds at most ``MAX_PAGE`` points and the answer
limit; a downsampled read at most ``max_points`` buckets, sized before it runs, and reads
~16 rollup rows per bucket and metric (:mod:`app.storage.history`). Pages and buckets of
more than 64 KiB are written in a worker thread, never on the event loop (10,000 rows of
29 MB took 0.3 s there).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import orjson

from app.codecs.json_arrays import encode_json
from app.core.errors import AnswerTooLarge, InvalidParameter
from app.core.threads import run_for_body
from app.schemas.jobs import MAX_STEP
from app.services.answer_json import INT, NULL, TEXT, dumps, stored, template
from app.services.jobs.parts import signature_options
from app.storage import history as store_history
from app.storage.parts import WEIGHTS_ARRAY, PendingStep, missing_sources
from app.storage.store import Store
from datarax.answers.jobs import Bucket, BucketMetric, History, HistoryPoint, MetricSpread
from datarax.errors import MetricsError
from datarax.metrics.merge import PartialMetrics, merge_parts

DEFAULT_PAGE = 1000
MAX_PAGE = store_history.MAX_PAGE
MAX_BUCKETS = store_history.MAX_BUCKETS

BUCKET_ENTRY_BYTES = 224 + 400
"""Bytes one metric adds to one bucket of a downsampled answer, besides four times its
name (the ``buckets`` entry with count/min/max/mean/last/last_step and its spread, and
the ``points`` row's mean and spread), at most: how a downsampled read is sized before it
runs."""
BUCKET_BYTES = 320
"""Bytes of one bucket besides its metrics (steps, the ``points`` row's members)."""


def _partial_point(entry: PendingStep) -> HistoryPoint:
    """An incomplete step's row: reduced over the parts so far (null when they cannot be)."""
    ops, nan_policy = signature_options(entry.signature)
    loaded = []
    for _, arrays in entry.parts:
        metrics = {n: a for n, a in arrays.items() if n != WEIGHTS_ARRAY}
        loaded.append(PartialMetrics(metrics, weights=arrays.get(WEIGHTS_ARRAY)))
    reduced: Any
    try:
        merged = merge_parts(loaded)
        reduced = stored(encode_json(merged.reduce(ops, nan_policy=nan_policy)))
    except MetricsError:
        reduced = None
    received = [source for source, _ in entry.parts]
    missing = missing_sources(received, entry.sources)
    return HistoryPoint(
        step=entry.step,
        reduced=reduced,
        received_at=entry.received_at,
        complete=False,
        sources=entry.sources,
        received_sources=received,
        missing_sources=NULL if missing is None else missing,  # a partial row has it
    )


def _too_large(what: str, max_bytes: int, fix: str) -> AnswerTooLarge:
    return AnswerTooLarge(
        f"{what} passes the answer limit of {max_bytes} bytes (DATARAX_MAX_ANSWER_MB); {fix}"
    )


def fitting_buckets(names: Sequence[str], max_points: int, max_bytes: int) -> int:
    """The most buckets (up to ``max_points``) whose answer stays within ``max_bytes``.

    Raises:
      AnswerTooLarge: not even 2 buckets fit.
    """
    per_bucket = BUCKET_BYTES + sum(4 * len(n.encode()) + BUCKET_ENTRY_BYTES for n in names)
    fit = min(max_points, (max_bytes - 1024) // per_bucket)
    if fit < 2:
        raise _too_large(
            f"a downsampled history of {len(names)} metrics ({per_bucket} bytes a bucket)",
            max_bytes,
            "read a shorter step range or a plain page",
        )
    return fit


async def history(
    store: Store,
    job: str,
    *,
    since_step: int | None = None,
    until_step: int | None = None,
    after_step: int | None = None,
    limit: int = DEFAULT_PAGE,
    max_points: int | None = None,
    include_partial: bool = False,
    max_bytes: int | None = None,
) -> bytes:
    """A page of the job's steps, or its downsampled buckets, as JSON bytes.

    One answer shape for both (issue 27): ``kind`` is ``"points"`` or ``"buckets"`` and
    ``points`` is always there; downsampled, each of its rows is one bucket: ``step``
    the newest step in the bucket with a value, ``reduced`` each metric's mean over the
    bucket (null: no finite value), ``received_at`` and ``sources`` null, and
    ``start_step``, ``end_step``, ``count``. The mean, not the last value, so a plotted
    line of a downsampled read follows the data rather than aliasing it; ``buckets`` keeps
    ``min``, ``max``, ``mean`` and ``last`` per metric (extended, not renamed).

    ``max_bytes`` (``DATARAX_MAX_ANSWER_MB``): a page is cut short before its JSON would
    pass it (``next_after_step`` then gives the rest); a downsampled read answers fewer
    buckets than ``max_points`` where that many would not fit. Memory stays within it
    too: points are read until the budget is spent, and buckets are sized before any is
    read.

    Raises:
      InvalidParameter: ``since_step`` above ``until_step``.
      AnswerTooLarge: one stored point alone, or two buckets, pass ``max_bytes``.
    """
    low = 0 if since_step is None else since_step
    high = MAX_STEP if until_step is None else until_step
    if low > high:
        raise InvalidParameter(
            ["query", "since_step"], f"since_step {low} is above until_step {high}"
        )
    if after_step is not None:
        low = max(low, after_step + 1)
    budget = None if max_bytes is None else max(1, max_bytes - 256 - len(job))
    read = await store_history.read_history(
        store,
        job,
        low,
        high,
        limit=limit,
        include_partial=include_partial,
        page_bytes=budget,
        max_points=max_points,
        buckets_for=None
        if max_bytes is None or max_points is None
        else lambda names: fitting_buckets(names, max_points, max_bytes),
    )
    if read.buckets is not None:
        width, buckets = read.width, read.buckets
        size = sum(BUCKET_BYTES + len(b.metrics) * BUCKET_ENTRY_BYTES for b in buckets)
        return await run_for_body(lambda: _buckets(job, width, buckets), size)
    entries, more = read.entries, read.more
    return await run_for_body(
        lambda: _page_answer(job, entries, more, budget), _page_bytes(entries)
    )


def _page_bytes(entries: Sequence[store_history.StoredPoint | PendingStep]) -> int:
    """About the bytes a page's rows take (an incomplete step, merged from its parts,
    counted as 64 KiB)."""
    return sum(
        len(e.reduced) + store_history.POINT_OVERHEAD
        if isinstance(e, store_history.StoredPoint)
        else 64 * 1024
        for e in entries
    )


# A page's rows are written from templates of the answer classes: a page holds up to
# 10,000 rows (see app.services.jobs.answer_json).
_PAGE = template(
    History(job=TEXT, kind="points", downsampled=False, points=TEXT, next_after_step=TEXT)
)
_STORED_ROW = template(
    HistoryPoint(step=INT, reduced=TEXT, received_at=TEXT, complete=True, sources=INT)
)
_STORED_ROW_SPREAD = template(
    HistoryPoint(step=INT, reduced=TEXT, received_at=TEXT, complete=True, sources=INT, spread=TEXT)
)


_POINTS_SLOT = b"\x00points\x00"  # where a page's rows go in its answer (no job name has it)


def _page_answer(
    job: str,
    entries: list[store_history.StoredPoint | PendingStep],
    more: bool,
    budget: int | None,
) -> bytes:
    """A page's answer, its rows copied once (a worker thread writes it: each copy of
    megabytes holds the interpreter's lock)."""
    parts, next_after = _page(job, entries, more, budget)
    head, tail = (_PAGE % (encode_json(job), _POINTS_SLOT, next_after)).split(_POINTS_SLOT)
    pieces = [head, b"["]
    for part in parts:
        pieces += (part, b",")
    pieces[-1:] = [b"]", tail] if parts else [b"[", b"]", tail]
    return b"".join(pieces)


def _page(
    job: str,
    entries: list[store_history.StoredPoint | PendingStep],
    more: bool,
    budget: int | None,
) -> tuple[list[bytes], bytes]:
    """A page's rows and ``next_after_step``, cut where ``budget`` runs out."""
    parts: list[bytes] = []
    used = 0
    for entry in entries:
        if isinstance(entry, store_history.StoredPoint):
            if entry.spread:
                text = _STORED_ROW_SPREAD % (
                    entry.step,
                    entry.reduced.encode(),
                    encode_json(entry.received_at),
                    entry.sources,
                    entry.spread.encode(),
                )
            else:
                text = _STORED_ROW % (
                    entry.step,
                    entry.reduced.encode(),
                    encode_json(entry.received_at),
                    entry.sources,
                )
        else:
            text = dumps(_partial_point(entry))
        used += len(text) + 1
        if budget is not None and used > budget:
            if not parts:
                raise _too_large(
                    f"step {entry.step} of job {job!r} alone ({len(text)} bytes)",
                    budget,
                    "raise DATARAX_MAX_ANSWER_MB to read it",
                )
            more = True  # cut here: the next page starts at this entry
            break
        parts.append(text)
    shown = entries[: len(parts)]
    next_after = b"%d" % shown[-1].step if more and shown else b"null"
    return parts, next_after


# A downsampled answer's buckets and rows, likewise (up to 10,000 buckets: building and
# serialising instances took twice as long as the storage read of 1,000).
_BUCKETS = template(
    History(
        job=TEXT,
        kind="buckets",
        downsampled=True,
        points=TEXT,
        next_after_step=None,
        bucket_steps=INT,
        buckets=TEXT,
    )
)
_BUCKET = template(Bucket(start_step=INT, end_step=INT, metrics=TEXT))
_BUCKET_SPREAD = template(Bucket(start_step=INT, end_step=INT, metrics=TEXT, spread=TEXT))
_BUCKET_METRIC = template(
    BucketMetric(count=INT, min=TEXT, max=TEXT, mean=TEXT, last=TEXT, last_step=INT)
)
_BUCKET_EXTREMES = template(
    MetricSpread(min=TEXT, max=TEXT, min_device=INT, max_device=INT, min_step=INT, max_step=INT)
)
_BUCKET_ROW = template(
    HistoryPoint(
        step=INT,
        reduced=TEXT,
        received_at=None,
        complete=True,
        sources=None,
        start_step=INT,
        end_step=INT,
        count=INT,
    )
)
_BUCKET_ROW_SPREAD = template(
    HistoryPoint(
        step=INT,
        reduced=TEXT,
        received_at=None,
        complete=True,
        sources=None,
        spread=TEXT,
        start_step=INT,
        end_step=INT,
        count=INT,
    )
)


def _object(entries: dict[str, bytes]) -> bytes:
    """A JSON object of members already encoded."""
    return b"{" + b",".join([orjson.dumps(k) + b":" + v for k, v in entries.items()]) + b"}"


def _buckets(job: str, width: int, buckets: list[store_history.Bucket]) -> bytes:
    """A downsampled answer: each bucket's ``points`` row and ``buckets`` entry (see
    :func:`history`), written from the templates above in the classes' member order."""
    rows: list[bytes] = []
    entries: list[bytes] = []
    number = orjson.dumps  # a float, None or NaN (null)
    for bucket in buckets:
        metrics: dict[str, bytes] = {}
        mean: dict[str, float | None] = {}
        for name, (n, total, low, high, last_step, last) in bucket.metrics.items():
            value = (total / n) if n else None
            mean[name] = value if value is None or math.isfinite(value) else None
            shown = last if last is None or math.isfinite(last) else None
            metrics[name] = _BUCKET_METRIC % (
                int(n),
                number(low),
                number(high),
                number(value),
                number(shown),
                int(last_step),
            )
        figures = bucket.metrics.values()
        step = max((int(f[4]) for f in figures), default=bucket.end)  # the newest with a value
        count = max((int(f[0]) for f in figures), default=0)
        text = _object(metrics)
        if bucket.spread:
            spread = _object(
                {
                    name: _BUCKET_EXTREMES
                    % (number(low), number(high), low_device, high_device, low_step, high_step)
                    for name, (low, low_device, low_step, high, high_device, high_step) in sorted(
                        bucket.spread.items()
                    )
                }
            )
            entries.append(_BUCKET_SPREAD % (bucket.start, bucket.end, text, spread))
            row = _BUCKET_ROW_SPREAD % (
                step,
                orjson.dumps(mean),
                spread,
                bucket.start,
                bucket.end,
                count,
            )
        else:
            entries.append(_BUCKET % (bucket.start, bucket.end, text))
            row = _BUCKET_ROW % (step, orjson.dumps(mean), bucket.start, bucket.end, count)
        rows.append(row)
    return _BUCKETS % (
        encode_json(job),
        b"[" + b",".join(rows) + b"]",
        width,
        b"[" + b",".join(entries) + b"]",
    )
