"""Reading a job's metric history: a page of steps, or downsampled buckets, as JSON bytes.

Memory and time per request: a page holds at most ``MAX_PAGE`` points and the answer
limit; a downsampled read at most ``max_points`` buckets, sized before it runs, and reads
~16 rollup rows per bucket and metric (:mod:`app.storage.history`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from app.codecs.json_arrays import encode_json
from app.core.errors import AnswerTooLarge, InvalidParameter
from app.core.threads import run_for_body
from app.schemas.jobs import MAX_STEP
from app.services.jobs.parts import signature_options
from app.storage import history as store_history
from app.storage.parts import WEIGHTS_ARRAY, PendingStep, missing_sources
from app.storage.store import Store
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


def _partial_point(entry: PendingStep) -> dict[str, Any]:
    """An incomplete step's row: reduced over the parts so far (null when they cannot be)."""
    ops, nan_policy = signature_options(entry.signature)
    loaded = []
    for _, arrays in entry.parts:
        metrics = {n: a for n, a in arrays.items() if n != WEIGHTS_ARRAY}
        loaded.append(PartialMetrics(metrics, weights=arrays.get(WEIGHTS_ARRAY)))
    reduced: Any
    try:
        merged = merge_parts(loaded)
        reduced = orjson.loads(encode_json(merged.reduce(ops, nan_policy=nan_policy)))
    except MetricsError:
        reduced = None
    received = [source for source, _ in entry.parts]
    return {
        "step": entry.step,
        "reduced": reduced,
        "received_at": entry.received_at,
        "complete": False,
        "sources": entry.sources,
        "received_sources": received,
        "missing_sources": missing_sources(received, entry.sources),
    }


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
    head = b'{"job":' + encode_json(job)
    if read.buckets is not None:
        rendered = [_bucket_json(b) for b in read.buckets]
        return (
            head
            + b',"kind":"buckets","downsampled":true,"bucket_steps":%d,"points":' % read.width
            + orjson.dumps([_bucket_point(b) for b in rendered])
            + b',"buckets":'
            + orjson.dumps(rendered)
            + b',"next_after_step":null}'
        )
    return head + await _page(job, read.entries, read.more, budget)


async def _page(
    job: str,
    entries: list[store_history.StoredPoint | PendingStep],
    more: bool,
    budget: int | None,
) -> bytes:
    """The rest of a page's answer after ``{"job":...``, cut where ``budget`` runs out."""
    parts: list[bytes] = []
    used = 0
    for entry in entries:
        if isinstance(entry, store_history.StoredPoint):
            text = b'{"step":%d,"reduced":%s,"received_at":%s,"complete":true,"sources":%d%s}' % (
                entry.step,
                entry.reduced.encode(),
                encode_json(entry.received_at),
                entry.sources,
                b',"spread":' + entry.spread.encode() if entry.spread else b"",
            )
        else:
            text = orjson.dumps(await run_for_body(functools.partial(_partial_point, entry), 0))
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
    return (
        b',"kind":"points","downsampled":false,"points":['
        + b",".join(parts)
        + b'],"next_after_step":'
        + next_after
        + b"}"
    )


def _bucket_json(bucket: store_history.Bucket) -> dict[str, Any]:
    metrics = {}
    for name, (n, total, low, high, last_step, last) in bucket.metrics.items():
        metrics[name] = {
            "count": int(n),
            "min": low,
            "max": high,
            "mean": (total / n) if n else None,
            "last": last if last is None or math.isfinite(last) else None,
            "last_step": int(last_step),
        }
    spread = {
        name: {
            "min": low,
            "max": high,
            "min_device": low_device,
            "max_device": high_device,
            "min_step": low_step,
            "max_step": high_step,
        }
        for name, (low, low_device, low_step, high, high_device, high_step) in sorted(
            bucket.spread.items()
        )
    }
    out = {"start_step": bucket.start, "end_step": bucket.end, "metrics": metrics}
    if spread:
        out["spread"] = spread
    return out


def _bucket_point(bucket: Mapping[str, Any]) -> dict[str, Any]:
    """One ``points`` row of a downsampled answer, from its bucket (see :func:`history`)."""
    metrics = bucket["metrics"]
    mean = {name: entry["mean"] for name, entry in metrics.items()}
    step = max((entry["last_step"] for entry in metrics.values()), default=bucket["end_step"])
    return {
        "step": step,
        "reduced": {k: (v if v is None or math.isfinite(v) else None) for k, v in mean.items()},
        "received_at": None,
        "complete": True,
        "sources": None,
        "start_step": bucket["start_step"],
        "end_step": bucket["end_step"],
        "count": max((entry["count"] for entry in metrics.values()), default=0),
        **({"spread": bucket["spread"]} if "spread" in bucket else {}),
    }
