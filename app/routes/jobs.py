"""``POST/GET /v1/jobs/{job}/metrics``: HTTP only (app.services.jobs does the work)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from starlette.responses import Response

from app.deps import BearerDoc, SettingsDep, StoreDep, TelemetryDep
from app.openapi import NanPolicyQuery, ReduceQuery, problem_responses, request_body_openapi
from app.routing import json_response, media_type
from app.schemas.jobs import JOB_NAME_PATTERN, JobHistory, JobPointCreated
from app.schemas.metrics import METRICS_REQUEST_EXAMPLE
from app.services import jobs

router = APIRouter(tags=["jobs"])

JobName = Annotated[
    str,
    Path(
        pattern=JOB_NAME_PATTERN,
        description="job name: 1-128 of letters, digits, '.', '_' and '-'",
        examples=["llm-sweep-7"],
    ),
]


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
    point = await jobs.push_point(
        store,
        job,
        await request.body(),
        media_type(request),
        request.headers.get("content-type"),
        max_bytes=settings.max_body_bytes,
        step=step,
        reduce=reduce,
        nan_policy=nan_policy,
    )
    telemetry.count_reduction("job")
    telemetry.job_points.inc()
    return json_response(point.body, 201 if point.created else 200)


@router.get(
    "/v1/jobs/{job}/metrics",
    summary="A job's metric history",
    response_class=Response,
    responses={200: {"model": JobHistory, "description": "points in step order"}},
)
async def get_job_metrics(job: JobName, store: StoreDep) -> Response:
    """``{"job", "points": [{"step", "reduced", "received_at"}]}`` in step order; an
    unknown job has no points."""
    return json_response(await jobs.history(store, job))
