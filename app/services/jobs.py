"""Job metric history as plain functions: reduce and store one step, read a job's points.

Same step posted twice: the newer point *replaces* the stored one (``created`` False). A
training job that retries a POST after a lost answer must not be refused, and the latest
values are the ones it meant; ``received_at`` tells when a point was last written. A job
nobody has posted to yet has an empty history: dashboards may poll a job before its first
step arrives.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.codecs.json_arrays import encode_json
from app.errors import InvalidParameter
from app.ids import utc_now
from app.routing import run_for_body
from app.schemas.jobs import JobMetricsRequest
from app.services.metrics import decode_metrics_body, reduce_metrics
from app.store import Store


@dataclass(frozen=True)
class StoredPoint:
    """A point as answered: ``created`` says whether its step was new."""

    created: bool
    body: bytes


async def push_point(
    store: Store,
    job: str,
    body: bytes,
    media: str | None,
    content_type: str | None,
    *,
    max_bytes: int,
    step: int | None,
    reduce: str | None,
    nan_policy: str | None,
) -> StoredPoint:
    """Decodes and reduces one step's metrics and stores the reduced values durably.

    Args:
      store: the open store.
      job: the job's name (already checked against the path pattern).
      body, media, content_type: the request body and its media type (JSON or npz).
      max_bytes: the largest decompressed npz accepted.
      step, reduce, nan_policy: npz bodies' query options.

    Raises:
      ServiceError: as ``decode_metrics_body``, and ``validation_error`` for an npz body
        without ``?step=``; MetricsError with the library's codes.
    """

    def work() -> tuple[int, bytes, int]:
        data = decode_metrics_body(
            body,
            media,
            content_type,
            JobMetricsRequest,
            max_bytes=max_bytes,
            reduce_query=reduce,
            nan_policy_query=nan_policy,
            step_query=step,
        )
        if data.step is None:
            raise InvalidParameter(["query", "step"], "npz bodies need ?step=N (an integer >= 0)")
        reduced, num_devices = reduce_metrics(data)
        return data.step, encode_json(reduced), num_devices

    point_step, reduced_json, num_devices = await run_for_body(work, len(body))
    received_at = utc_now()
    created = await store.put_job_point(job, point_step, reduced_json.decode(), received_at)
    answer = b"".join(
        (
            b'{"job":',
            encode_json(job),
            b',"step":%d,"reduced":' % point_step,
            reduced_json,
            b',"received_at":',
            encode_json(received_at),
            b',"num_devices":%d}' % num_devices,
        )
    )
    return StoredPoint(created=created, body=answer)


async def history(store: Store, job: str) -> bytes:
    """``{"job", "points": [{"step", "reduced", "received_at"}]}`` in step order, as JSON."""
    points = await store.job_points(job)
    parts = [
        b'{"step":%d,"reduced":%s,"received_at":%s}'
        % (p.step, p.reduced.encode(), encode_json(p.received_at))
        for p in points
    ]
    return b'{"job":' + encode_json(job) + b',"points":[' + b",".join(parts) + b"]}"
