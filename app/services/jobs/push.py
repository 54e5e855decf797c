"""Pushing job metrics: a decoded batch -> its rows -> one transaction -> the answer.

Rules:

- A step is written once. The same content again (same arrays, dtypes, reduce ops,
  weights and NaN policy: compared by a digest of what was pushed) is a no-op answered
  200; other content is 409 ``step_conflict``. A job retrying after a lost answer gets
  200, never a duplicate.
- ``sources > 1``: each source pushes the stacked metrics of its own devices; the step is
  stored (``complete``) when every source's part has arrived, reduced over all devices
  at once (:func:`datarax.metrics.merge.merge_steps`, sources in natural order of
  their names). Parts are rows of their own, so no push ever rewrites another's data.
- A batch is all or nothing: one transaction.

Memory and time per request: a batch holds at most 1,000 points and the body limit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from app.core.threads import run_for_body, thread_for_body
from app.services.answer_json import INT, TEXT, dumps, template
from app.services.jobs.decode import JobBatch, decode_batch, decode_npz_batch
from app.services.jobs.limits import DEFAULT_LIMITS, PointLimits
from app.services.jobs.parts import PART_RULES
from app.services.jobs.rows import rows_of
from app.storage import jobs as store_jobs
from app.storage.store import Store
from datarax.answers.jobs import BatchResult, PushResult

_POLICY_SAYS = {
    "propagate": "stored as null where they reach a reduced value (nan_policy propagate)",
    "omit": "left out of the reductions (nan_policy omit)",
}


def _non_finite(arrays: Iterable[tuple[str, Any]]) -> dict[str, int]:
    """``{metric: values that are NaN or infinite}`` over (name, array) pairs."""
    found: dict[str, int] = {}
    for name, values in arrays:
        a = np.asarray(values)
        if a.dtype.kind in "fc":
            bad = int(a.size - np.count_nonzero(np.isfinite(a)))
            if bad:
                found[name] = found.get(name, 0) + bad
    return found


def non_finite_warnings(batch: JobBatch) -> list[str]:
    """One line per metric that holds NaN or infinite values, with what the NaN policy
    did with them (``raise`` refuses the push before it gets here)."""
    if batch.columns is not None:
        found = _non_finite(batch.columns.arrays.items())
        policy = batch.columns.nan_policy
    else:
        found = _non_finite((n, v) for p in batch.points for n, v in p.metrics.items())
        policy = batch.points[0].nan_policy if batch.points else "propagate"
    says = _POLICY_SAYS.get(policy, f"handled by nan_policy {policy}")
    return [f"{name}: {count} NaN or infinite value(s), {says}" for name, count in found.items()]


@dataclass(frozen=True)
class PushAnswer:
    """A push's answer body (the JSON of a :class:`~datarax.answers.jobs.PushResult` or
    :class:`~datarax.answers.jobs.BatchResult`), whether it stored anything new (201 or
    200), and how many points or parts it newly wrote."""

    created: bool
    body: bytes
    stored: int = 0


_PUSHED = template(
    PushResult(
        job=TEXT,
        step=INT,
        source=TEXT,
        sources=INT,
        complete=TEXT,
        reduced=TEXT,
        received_at=TEXT,
        num_devices=INT,
        missing_sources=TEXT,
        warnings=TEXT,
    )
)
"""A :class:`~datarax.answers.jobs.PushResult`'s JSON as a %-format (every member is
always present): the push answers without building the answer object."""


async def push_single(store: Store, job: str, batch: JobBatch) -> PushAnswer:
    """One step (or one source's part of it): the answer echoes the stored point."""
    rows = await run_for_body(lambda: rows_of(batch), 64 * 1024 + len(batch) * 1024)
    outcome = await store_jobs.store_points(store, job, rows.items, PART_RULES)
    (item,) = outcome.items
    reduced = item.step_reduced if item.complete and item.step_reduced else None
    body = _PUSHED % (
        orjson.dumps(job),
        item.step,
        orjson.dumps(item.source),
        item.sources,
        b"true" if item.complete else b"false",
        b"null" if reduced is None else reduced.encode() if isinstance(reduced, str) else reduced,
        orjson.dumps(item.received_at),
        item.num_devices,
        orjson.dumps(item.missing),
        orjson.dumps(non_finite_warnings(batch)),
    )
    return PushAnswer(created=item.created, body=body, stored=int(item.created))


def _store_batch(store: Store, job: str, batch: JobBatch) -> PushAnswer:
    """Reduces and stores a decoded batch in the calling worker thread; the answer counts
    what was new."""
    outcome = store_jobs.store_batch_here(store, job, rows_of(batch), PART_RULES)
    answer = BatchResult(
        job=job,
        points=outcome.points,
        created=outcome.created,
        unchanged=outcome.points - outcome.created,
        completed_steps=outcome.completed,
        received_at=outcome.received_at,
        warnings=non_finite_warnings(batch),
    )
    return PushAnswer(created=outcome.created > 0, body=dumps(answer), stored=outcome.created)


async def push_batch(
    store: Store, job: str, body: bytes, limits: PointLimits = DEFAULT_LIMITS
) -> PushAnswer:
    """A JSON batch body, all or nothing. Decoded and stored in one worker thread (one hop
    off the event loop, not two)."""
    return await thread_for_body(
        lambda: _store_batch(store, job, decode_batch(body, limits)), len(body)
    )


async def push_npz_batch(store: Store, job: str, body: bytes, **options: Any) -> PushAnswer:
    """An npz batch body (:func:`~app.services.jobs.decode.decode_npz_batch` takes the
    options), all or nothing; one worker thread."""
    return await thread_for_body(
        lambda: _store_batch(store, job, decode_npz_batch(body, **options)), len(body)
    )
