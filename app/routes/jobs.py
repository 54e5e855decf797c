"""``POST/GET /v1/jobs/{job}/metrics``: reduce and store one step of a job; read history.

Same step posted twice: the newer point *replaces* the stored one (200 instead of 201).
A training job that retries a POST after a lost answer must not be refused, and the
latest values are the ones it meant; ``received_at`` tells when a point was last written.

A job nobody has posted to yet has an empty history (200, ``points: []``): dashboards may
poll a job before its first step arrives.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from starlette.responses import Response

from app.deps import BearerDoc, SettingsDep, StoreDep, TelemetryDep, media_type
from app.errors import InvalidParameter
from app.metrics_io import encode_json
from app.plans import utc_now
from app.routes.metrics import (
    NanPolicyQuery,
    ReduceQuery,
    decode_metrics_body,
    reduce_metrics,
    request_body_openapi,
    run_for_body,
)
from app.schemas import (
    JOB_NAME_PATTERN,
    METRICS_REQUEST_EXAMPLE,
    JobHistory,
    JobMetricsRequest,
    JobPointCreated,
    problem_responses,
)

router = APIRouter(tags=["jobs"])

JobName = Annotated[
    str,
    Path(
        pattern=JOB_NAME_PATTERN,
        description="job name: 1-128 of letters, digits, '.', '_' and '-'",
        examples=["llm-sweep-7"],
    ),
]


def _json(content: bytes, status: int = 200) -> Response:
    return Response(content, status_code=status, media_type="application/json")


@router.post(
    "/v1/jobs/{job}/metrics",
    summary="Reduce and store one step",
    response_class=Response,
    status_code=201,
    dependencies=[BearerDoc],
    openapi_extra=request_body_openapi(
        "JobMetricsRequest", {**METRICS_REQUEST_EXAMPLE, "step": 10}
    ),
    responses={
        201: {"model": JobPointCreated, "description": "a new step, stored"},
        200: {"model": JobPointCreated, "description": "the step existed and was replaced"},
        **problem_responses(401, 413, 415, 422),
    },
)
async def post_job_metrics(
    job: JobName,
    request: Request,
    settings: SettingsDep,
    store: StoreDep,
    telemetry: TelemetryDep,
    step: Annotated[int | None, Query(ge=0, description="npz bodies only: the step")] = None,
    reduce: ReduceQuery = None,
    nan_policy: NanPolicyQuery = None,
) -> Response:
    """Takes the body of ``POST /v1/metrics/reduce`` plus ``"step"`` (int >= 0; npz:
    ``?step=``), reduces it and stores the reduced values durably before answering.
    201 for a new step, 200 when it replaced the stored point of the same step. Errors as
    for reduce."""
    body = await request.body()
    media, content_type = media_type(request), request.headers.get("content-type")

    def work() -> tuple[int, bytes, int]:
        data = decode_metrics_body(
            body,
            media,
            content_type,
            JobMetricsRequest,
            max_bytes=settings.max_body_bytes,
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
    telemetry.count_reduction("job")
    telemetry.job_points.inc()
    point = b"".join(
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
    return _json(point, 201 if created else 200)


@router.get(
    "/v1/jobs/{job}/metrics",
    summary="A job's metric history",
    response_class=Response,
    responses={200: {"model": JobHistory, "description": "points in step order"}},
)
async def get_job_metrics(job: JobName, store: StoreDep) -> Response:
    """``{"job", "points": [{"step", "reduced", "received_at"}]}`` in step order; an
    unknown job has no points."""
    points = await store.job_points(job)
    parts = [
        b'{"step":%d,"reduced":%s,"received_at":%s}'
        % (p.step, p.reduced.encode(), encode_json(p.received_at))
        for p in points
    ]
    return _json(b'{"job":' + encode_json(job) + b',"points":[' + b",".join(parts) + b"]}")
