"""``/v1/jobs``: job metric history. HTTP only (the app.services.jobs package does the work)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from starlette.responses import Response

from app.api.deps import BearerDoc, JsonBody, StoreDep
from app.api.openapi import NanPolicyQuery, ReduceQuery, problem_responses, request_body_openapi
from app.api.routing import (
    BytesResponse,
    JsonBodyRoute,
    ParamsRoute,
    answer_response,
    media_type,
    read_body,
    require_json,
)
from app.codecs.media import JSON_MEDIA_TYPE, NPZ_MEDIA_TYPE
from app.core.errors import InvalidParameter
from app.core.threads import run_for_body
from app.schemas.jobs import (
    JOB_NAME_PATTERN,
    JOB_NAME_RULE,
    JOB_POINT_EXAMPLE,
    MAX_SOURCES,
    MAX_STEP,
    SOURCE_PATTERN,
    JobBatchRequest,
    JobPatchRequest,
)
from app.services.jobs import history, push, summaries
from app.services.jobs.decode import decode_point
from app.services.jobs.limits import PointLimits
from datarax.answers.jobs import BatchResult, History, JobList, JobSummary, PushResult

router = APIRouter(tags=["jobs"], route_class=JsonBodyRoute)
Endpoint = Callable[..., Awaitable[Response]]


def _lean_post(path: str, **kwargs: Any) -> Callable[[Endpoint], Endpoint]:
    """``@router.post`` for the push routes, as a :class:`~app.api.routing.ParamsRoute`: the
    same operation and validation, without FastAPI's per-request dependency machinery
    (a job pushed from 64 hosts pays it 64 times a step)."""

    def register(endpoint: Endpoint) -> Endpoint:
        router.add_api_route(
            path, endpoint, methods=["POST"], route_class_override=ParamsRoute, **kwargs
        )
        return endpoint

    return register


JobName = Annotated[
    str,
    Path(
        pattern=JOB_NAME_PATTERN,
        description=f"job name: {JOB_NAME_RULE}",
        examples=["llm-sweep-7"],
    ),
]
StepQuery = Annotated[int | None, Query(ge=0, le=MAX_STEP)]


def _only_query(request: Request, *allowed: str) -> None:
    """422 for a query parameter this operation does not take (a typo must not be
    silently ignored: ``?limt=10`` would answer everything), or one given twice
    (``?reduce=a:mean&reduce=b:max`` would keep one of them)."""
    seen: set[str] = set()
    for name, _ in request.query_params.multi_items():
        if name not in allowed:
            raise InvalidParameter(
                ["query", name],
                f"unknown query parameter; this operation takes {', '.join(allowed) or 'none'}",
                error_type="extra_forbidden",
            )
        if name in seen:
            raise InvalidParameter(
                ["query", name],
                "given twice; give it once (reduce takes a list: reduce=loss:mean,step:max)",
            )
        seen.add(name)


def _limits(state: Any) -> PointLimits:
    """The caps every push path checks: ``DATARAX_MAX_POINT_VALUES``, and
    ``DATARAX_MAX_ANSWER_MB`` (a stored point must fit in an answer); made once an app."""
    limits: PointLimits | None = getattr(state, "point_limits", None)
    if limits is None:
        settings = state.settings
        limits = PointLimits(
            max_values=settings.max_point_values, max_answer_bytes=settings.max_answer_bytes
        )
        state.point_limits = limits
    return limits


SourceQuery = Annotated[
    str | None, Query(pattern=SOURCE_PATTERN, description="npz bodies only: the source")
]
SourcesQuery = Annotated[
    int | None, Query(ge=1, le=MAX_SOURCES, description="npz bodies only: the sources")
]


@router.get(
    "/v1/jobs",
    summary="List jobs",
    response_class=Response,
    responses={200: {"model": JobList, "description": "most recently pushed first"}},
)
async def list_jobs(
    request: Request,
    store: StoreDep,
    limit: Annotated[int, Query(ge=1, le=1000, examples=[100])] = 100,
    offset: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
) -> Response:
    """Every job with its points, first and last step, ``last_push_at``, ``finished``, and
    the newest incomplete multi-source step with the sources that lag."""
    _only_query(request, "limit", "offset")
    return answer_response(await summaries.list_jobs(store, limit, offset))


@router.get(
    "/v1/jobs/{job}",
    summary="Read one job",
    response_class=Response,
    responses={200: {"model": JobSummary, "description": "the job"}, **problem_responses(404)},
)
async def get_job(job: JobName, request: Request, store: StoreDep) -> Response:
    """The job's entry of ``GET /v1/jobs``; 404 ``job_not_found``."""
    _only_query(request)
    return answer_response(await summaries.get_job(store, job))


@router.patch(
    "/v1/jobs/{job}",
    summary="Mark a job finished or link it to its plan",
    response_class=Response,
    dependencies=[BearerDoc, JsonBody],
    responses={
        200: {"model": JobSummary, "description": "the job, updated"},
        **problem_responses(401, 404, 409, 415, 422),
    },
)
async def update_job(
    job: JobName, body: JobPatchRequest, request: Request, store: StoreDep
) -> Response:
    """``{"finished": true}`` marks the job finished (dashboards and the stale-job gauge
    leave it out); ``false`` reopens it. ``{"plan": id, "step_time_metric": "step_time"}``
    links it to a stored plan: its answers then carry ``fidelity``, the plan's predicted
    step time against the median of the metric's pushed values (404 ``mesh_not_found``
    for no such plan; 422 for a plan without a step estimate; 409 ``job_not_linked`` for
    ``step_time_metric`` alone on a job linked to no plan)."""
    _only_query(request)
    return answer_response(
        await summaries.update_job(
            store,
            job,
            finished=body.finished,
            plan=body.plan,
            step_time_metric=body.step_time_metric,
        )
    )


@router.delete(
    "/v1/jobs/{job}",
    summary="Delete a job",
    status_code=204,
    response_class=Response,
    dependencies=[BearerDoc],
    responses={204: {"description": "deleted"}, **problem_responses(401, 404, 422)},
)
async def delete_job(job: JobName, request: Request, store: StoreDep) -> Response:
    """Deletes the job's history (points, parts, rollups) durably; 404 ``job_not_found``."""
    _only_query(request)
    await summaries.delete_job(store, job)
    return Response(status_code=204)


@router.delete(
    "/v1/jobs/{job}/plan",
    summary="Unlink a job from its plan",
    status_code=204,
    response_class=Response,
    dependencies=[BearerDoc],
    responses={204: {"description": "unlinked"}, **problem_responses(401, 404, 422)},
)
async def unlink_job(job: JobName, request: Request, store: StoreDep) -> Response:
    """Removes the job's link to its plan (set by ``PATCH /v1/jobs/{job}`` ``plan``),
    whether the plan is still stored or was deleted: the job then answers no
    ``fidelity`` and a jobs calibration leaves it out. 404 ``job_not_found``; 404
    ``job_link_not_found`` when the job is linked to no plan."""
    _only_query(request)
    await summaries.unlink_job(store, job)
    return Response(status_code=204)


@_lean_post(
    "/v1/jobs/{job}/metrics",
    summary="Reduce and store one step",
    response_class=Response,
    status_code=201,
    dependencies=[BearerDoc],
    openapi_extra=request_body_openapi("JobMetricsRequest", JOB_POINT_EXAMPLE),
    responses={
        201: {"model": PushResult, "description": "a new step (or part), stored"},
        200: {"model": PushResult, "description": "the same content again: a no-op"},
        **problem_responses(401, 409, 413, 415, 422),
    },
)
async def push_job_metrics(
    job: JobName,
    request: Request,
    step: Annotated[int | None, Query(ge=0, le=MAX_STEP, description="npz bodies only")] = None,
    reduce: ReduceQuery = None,
    nan_policy: NanPolicyQuery = None,
    source: SourceQuery = None,
    sources: SourcesQuery = None,
) -> Response:
    """Takes the body of ``POST /v1/metrics/reduce`` plus ``"step"`` (npz: ``?step=``),
    reduces it and stores it durably before answering: 201 when new, 200 when the same
    content was stored before, 409 ``step_conflict`` for other content. Scalar metrics
    (``"lr": 0.001``) are stored as given. With ``"sources": n > 1`` each source
    (``"source"``) pushes its own devices; the step is complete, and reduced over every
    device, when all n parts arrived (422 ``part_mismatch`` / ``sources_mismatch`` when a
    part disagrees with the step's others). Caps, alike on every push path (JSON or npz,
    single or batch): at most 1,000 metrics a point (``too_many_metrics``), metric names
    of at most 250 characters (``metric_name_too_long``), and at most
    ``DATARAX_MAX_POINT_VALUES`` numbers (default 4,096) a point after reduction, with its
    JSON within ``DATARAX_MAX_ANSWER_MB`` (``value_too_large``). ``step`` and ``sources``
    take integral numbers (``1000`` or ``1000.0``)."""
    _only_query(request, "step", "reduce", "nan_policy", "source", "sources")
    state = request.app.state
    store, telemetry = state.store, state.telemetry
    body = await read_body(request)
    batch = await run_for_body(
        lambda: decode_point(
            body,
            media_type(request),
            request.headers.get("content-type"),
            max_bytes=state.byte_limits.body,
            step=step,
            reduce=reduce,
            nan_policy=nan_policy,
            source=source,
            sources=sources,
            limits=_limits(state),
        ),
        len(body),
    )
    answer = await push.push_single(store, job, batch)
    telemetry.count_reduction("job")
    telemetry.job_points.inc(answer.stored)
    return BytesResponse(answer.body, JSON_MEDIA_TYPE, 201 if answer.created else 200)


@_lean_post(
    "/v1/jobs/{job}/metrics/batch",
    summary="Store many steps at once",
    response_class=Response,
    status_code=201,
    dependencies=[BearerDoc],
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "JSON, or an np.savez archive (application/x-npz) of the whole "
            "batch, columnar: '_step' [n_points] integers, each metric [n_points, n_devices, "
            "...] (or [n_points]: one number per point), optional '_weights' [n_points, "
            "n_devices]; reduce, nan_policy, source and sources in the query string",
            "content": {
                JSON_MEDIA_TYPE: {
                    "schema": {"$ref": "#/components/schemas/JobBatchRequest"},
                    "example": JobBatchRequest.model_config["json_schema_extra"]["examples"][0],  # type: ignore[index]
                },
                NPZ_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}},
            },
        }
    },
    responses={
        201: {"model": BatchResult, "description": "stored (at least one point was new)"},
        200: {"model": BatchResult, "description": "every point was an identical retry"},
        **problem_responses(401, 409, 413, 415, 422),
    },
)
async def push_job_metrics_batch(
    job: JobName,
    request: Request,
    reduce: ReduceQuery = None,
    nan_policy: NanPolicyQuery = None,
    source: SourceQuery = None,
    sources: SourcesQuery = None,
) -> Response:
    """``{"points": [single push bodies]}``, 1 to 1,000, all or nothing in one durable
    transaction (any refused point refuses the batch, naming ``points[i]``). ``source`` and
    ``sources`` at the top are every point's defaults. The same batch as an npz archive
    (``application/x-npz``, columnar: ``_step``, one ``[n_points, n_devices, ...]`` array
    per metric, ``_weights``; options in the query) is stored exactly as the JSON one,
    without parsing 64 numbers of text per point. The caps of a single push hold for
    every point; an npz batch whose points' JSON could pass ``DATARAX_MAX_BODY_MB`` is
    422 ``value_too_large`` (it names its metrics once for all its points)."""
    state = request.app.state
    store, telemetry = state.store, state.telemetry
    media = media_type(request)
    if media == NPZ_MEDIA_TYPE:
        _only_query(request, "reduce", "nan_policy", "source", "sources")
        body = await read_body(request)
        answer = await push.push_npz_batch(
            store,
            job,
            body,
            max_bytes=state.byte_limits.body,
            reduce=reduce,
            nan_policy=nan_policy,
            source=source,
            sources=sources,
            limits=_limits(state),
        )
    else:
        require_json(request)
        _only_query(request)
        answer = await push.push_batch(store, job, await read_body(request), _limits(state))
    telemetry.count_reduction("job")
    telemetry.job_points.inc(answer.stored)
    return BytesResponse(answer.body, JSON_MEDIA_TYPE, 201 if answer.created else 200)


@router.get(
    "/v1/jobs/{job}/metrics",
    summary="A job's metric history",
    response_class=Response,
    responses={
        200: {"model": History, "description": "points in step order, or buckets"},
        **problem_responses(422),
    },
)
async def get_job_metrics(
    job: JobName,
    request: Request,
    store: StoreDep,
    since_step: StepQuery = None,
    until_step: StepQuery = None,
    # The last step is MAX_STEP: nothing comes after it (and after_step + 1 must fit SQLite).
    after_step: Annotated[int | None, Query(ge=0, le=MAX_STEP - 1)] = None,
    limit: Annotated[int, Query(ge=1, le=history.MAX_PAGE)] = history.DEFAULT_PAGE,
    max_points: Annotated[
        int | None,
        Query(ge=2, le=history.MAX_BUCKETS, description="downsample above this many points"),
    ] = None,
    include_partial: bool = False,
) -> Response:
    """Points ``{"step", "reduced", "received_at", "complete", "sources"}`` in step order,
    ``limit`` per page (default 1,000, at most 10,000; ``next_after_step`` gives the next
    page's ``after_step``), from ``since_step`` to ``until_step``. Complete steps only
    unless ``include_partial=true``. With ``max_points`` and more points than that in the
    range, the answer is ``"downsampled": true`` with at most ``max_points`` buckets that
    keep ``min``, ``max``, ``mean`` and ``last`` of each scalar metric. Both answers carry
    ``kind`` (``points`` or ``buckets``) and ``points``: downsampled, one row per bucket
    (``step``, ``reduced`` = each metric's bucket mean, ``start_step``, ``end_step``,
    ``count``), so a reader of ``points`` needs not know which it got. A page stops before
    its answer would pass ``DATARAX_MAX_ANSWER_MB`` (``next_after_step`` continues it); a
    downsampled answer then has fewer buckets (422 ``answer_too_large`` when one point,
    or two buckets, alone pass it). An unknown job has no points."""
    _only_query(
        request,
        "since_step",
        "until_step",
        "after_step",
        "limit",
        "max_points",
        "include_partial",
    )
    return BytesResponse(
        await history.history(
            store,
            job,
            since_step=since_step,
            until_step=until_step,
            after_step=after_step,
            limit=limit,
            max_points=max_points,
            include_partial=include_partial,
            max_bytes=request.app.state.byte_limits.answer,
        ),
        JSON_MEDIA_TYPE,
    )
