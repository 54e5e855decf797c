""":class:`Client` (blocking) and :class:`AsyncClient`: one set of operations
(:class:`_Api`), two transports. Each operation builds a typed
:class:`~datarax.client._core.Call`; the client's ``_send`` runs it with retries. An
:class:`_Operation` makes each one a method of both clients, typed for each: on
:class:`Client` it returns the answer (:mod:`datarax.client.answers`), on
:class:`AsyncClient` an awaitable of the same answer."""

from __future__ import annotations

import asyncio
import functools
import time
import types
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, Concatenate, Self, get_args, overload

import httpx
import numpy as np

from datarax.answers.base import decode as decode_answer
from datarax.client._core import (
    RETRY_STATUSES,
    Call,
    arrays_batch_call,
    auth_headers,
    batch_call,
    decode,
    history_params,
    history_points,
    push_call,
    raise_for_problem,
    reduce_call,
    retry_delay,
    service_url,
)
from datarax.client._pusher import AsyncPusher, Pusher
from datarax.client.answers import (
    BatchResult,
    CalibrationProfile,
    CollectAnswer,
    Devices,
    HardwareList,
    History,
    HistoryPoint,
    JobFidelity,
    JobList,
    JobSummary,
    LaunchConfig,
    MeshPlan,
    MeshPlanList,
    NamedModelList,
    PushResult,
    Readiness,
    Recommendations,
    ReduceAnswer,
    Session,
    StepAnswer,
)

DEFAULT_TIMEOUT_S = 60.0


class _Operation[**P, T]:
    """One operation of the service, written once as the :class:`Call` it sends, and a
    method of both clients: ``Client().op(...)`` returns ``T``, ``AsyncClient().op(...)``
    an ``Awaitable[T]`` (the client's ``_send`` runs the call either way).

    Python's types cannot say "a method returning ``W[T]``" for a wrapper ``W`` chosen by
    the subclass, so the choice is made where the method is looked up: ``__get__`` is
    overloaded on the client it is read from. ``build`` keeps the operation's own
    signature; its return annotation ``Call[T]`` names the answer type.
    """

    def __init__(self, build: Callable[Concatenate[Any, P], Call[T]]) -> None:
        self.build = build
        self.__doc__ = build.__doc__
        # The answer's type, read from ``Call[T]``: the client parses the JSON into it.
        answer = get_args(typing.get_type_hints(build)["return"])[0]

        def method(api: Any, /, *args: P.args, **kwargs: P.kwargs) -> Any:
            return api._send(build(api, *args, **kwargs), answer)

        self._method = functools.wraps(build)(method)

    @overload
    def __get__(self, api: None, owner: type | None = None) -> Self: ...

    @overload
    def __get__(self, api: Client, owner: type | None = None) -> Callable[P, T]: ...

    @overload
    def __get__(self, api: AsyncClient, owner: type | None = None) -> Callable[P, Awaitable[T]]: ...

    def __get__(self, api: object, owner: type | None = None) -> Any:
        if api is None:
            return self
        return types.MethodType(self._method, api)

    def __call__(self, api: Any, /, *args: P.args, **kwargs: P.kwargs) -> Any:
        # Read from the class (``Client.get_job(api, "run-1")``) it is still a function
        # of the client, as a plain method is.
        return self._method(api, *args, **kwargs)


NpzArrays = dict[str, np.ndarray]
"""An npz answer: one array per name (:func:`~datarax.client.from_npz`)."""


class _Api:
    """The service's operations; names follow its OpenAPI operation ids."""

    # health and devices
    @_Operation
    def check_readiness(self) -> Call[Readiness]:
        return Call("GET", "/health/ready")

    @_Operation
    def list_devices(self) -> Call[Devices]:
        return Call("GET", "/v1/devices")

    # meshes
    @_Operation
    def create_mesh(self, plan: Mapping[str, Any]) -> Call[MeshPlan]:
        """``POST /v1/meshes``: the stored plan (``id``, ``shards``, ...)."""
        return Call("POST", "/v1/meshes", json=plan)

    @_Operation
    def get_mesh(self, mesh_id: str) -> Call[MeshPlan]:
        return Call("GET", f"/v1/meshes/{mesh_id}")

    @_Operation
    def list_meshes(self, limit: int = 50, offset: int = 0) -> Call[MeshPlanList]:
        return Call("GET", "/v1/meshes", params={"limit": limit, "offset": offset})

    @_Operation
    def delete_mesh(self, mesh_id: str) -> Call[None]:
        return Call("DELETE", f"/v1/meshes/{mesh_id}")

    # metrics
    @_Operation
    def reduce_metrics(
        self,
        metrics: Mapping[str, Any],
        reduce: Mapping[str, str] | None = None,
        *,
        weights: Any = None,
        nan_policy: str | None = None,
        npz: bool = False,
        npz_answer: bool = False,
    ) -> Call[ReduceAnswer | NpzArrays]:
        """``POST /v1/metrics/reduce``; ``npz=True`` uploads the arrays as npz,
        ``npz_answer=True`` asks for an npz answer (a dict of arrays) in place of the
        JSON :class:`~datarax.client.answers.ReduceAnswer`."""
        call: Call[ReduceAnswer | NpzArrays] = reduce_call(
            metrics, reduce, weights, nan_policy, npz
        )
        call.accept = "application/x-npz" if npz_answer else None
        return call

    @_Operation
    def collect_metrics(self, metrics: Mapping[str, Any]) -> Call[CollectAnswer]:
        return Call("POST", "/v1/metrics/collect", json={"metrics": metrics})

    # jobs
    @_Operation
    def push_job_metrics(
        self,
        job: str,
        step: int,
        metrics: Mapping[str, Any],
        reduce: Mapping[str, str] | None = None,
        *,
        weights: Any = None,
        nan_policy: str | None = None,
        source: str | None = None,
        sources: int | None = None,
        npz: bool = False,
    ) -> Call[PushResult]:
        """``POST /v1/jobs/{job}/metrics``: one step (or this source's part of it).
        Returns a :class:`~datarax.client.PushResult`."""
        return push_call(job, step, metrics, reduce, weights, nan_policy, source, sources, npz)

    @_Operation
    def push_job_metrics_batch(
        self,
        job: str,
        points: list[Mapping[str, Any]],
        *,
        source: str | None = None,
        sources: int | None = None,
    ) -> Call[BatchResult]:
        """``POST /v1/jobs/{job}/metrics/batch``: up to 1,000 ``{"step", "metrics", ...}``
        points, all or nothing. Returns a :class:`~datarax.client.BatchResult`."""
        return batch_call(job, points, source, sources)

    @_Operation
    def push_job_metrics_arrays(
        self,
        job: str,
        steps: Any,
        metrics: Mapping[str, Any],
        reduce: Mapping[str, str] | None = None,
        *,
        weights: Any = None,
        nan_policy: str | None = None,
        source: str | None = None,
        sources: int | None = None,
    ) -> Call[BatchResult]:
        """``POST /v1/jobs/{job}/metrics/batch`` as one npz body: ``steps`` ``[P]`` and
        each metric stacked ``[P, n_devices, ...]`` (or ``[P]``), up to 1,000 points, all
        or nothing; stored exactly as the same points pushed one by one (a retry in JSON
        is a no-op). The fastest way to push history: no JSON numbers to write or parse.
        Returns a :class:`~datarax.client.BatchResult`."""
        return arrays_batch_call(job, steps, metrics, reduce, weights, nan_policy, source, sources)

    @_Operation
    def get_job_metrics(
        self,
        job: str,
        *,
        since_step: int | None = None,
        until_step: int | None = None,
        after_step: int | None = None,
        limit: int | None = None,
        max_points: int | None = None,
        include_partial: bool | None = None,
    ) -> Call[History]:
        """``GET /v1/jobs/{job}/metrics``: one page, or downsampled buckets; either way
        ``answer["points"]`` holds the rows and ``answer["kind"]`` says which
        (:class:`~datarax.client.History`)."""
        params = history_params(
            since_step=since_step,
            until_step=until_step,
            after_step=after_step,
            limit=limit,
            max_points=max_points,
            include_partial=include_partial,
        )
        return Call("GET", f"/v1/jobs/{job}/metrics", params=params)

    @_Operation
    def list_jobs(self, limit: int = 100, offset: int = 0) -> Call[JobList]:
        return Call("GET", "/v1/jobs", params={"limit": limit, "offset": offset})

    @_Operation
    def get_job(self, job: str) -> Call[JobSummary]:
        return Call("GET", f"/v1/jobs/{job}")

    @_Operation
    def update_job(self, job: str, *, finished: bool) -> Call[JobSummary]:
        return Call("PATCH", f"/v1/jobs/{job}", json={"finished": finished})

    @_Operation
    def link_job_to_plan(
        self, job: str, plan: str, *, step_time_metric: str = "step_time"
    ) -> Call[JobSummary]:
        """Links ``job`` to the stored ``plan``: its answers then carry ``fidelity``, the
        plan's predicted step time against the median of the pushed ``step_time_metric``
        (seconds a step)."""
        body = {"plan": plan, "step_time_metric": step_time_metric}
        return Call("PATCH", f"/v1/jobs/{job}", json=body)

    @_Operation
    def calibrate(self, jobs: Sequence[str], *, framework: str = "jax") -> Call[CalibrationProfile]:
        """Fits and stores a calibration profile on the measured steps of ``jobs`` (each
        linked to its plan); plans and recommendations then take its ``id`` as
        ``calibration``."""
        body = {"kind": "jobs", "jobs": list(jobs), "framework": framework}
        return Call("POST", "/v1/calibrations", json=body)

    @_Operation
    def calibrate_host(
        self, *, quick: bool = True, hardware: str | None = None
    ) -> Call[CalibrationProfile]:
        """Starts the host measuring its own devices; answers the profile ``running``
        (poll :meth:`get_calibration` until its ``status`` is ``done`` or ``failed``).
        Plans on hardware of the devices' ``device_kind`` then use it by default."""
        body: dict[str, Any] = {"kind": "host", "quick": quick}
        if hardware is not None:
            body["hardware"] = hardware
        return Call("POST", "/v1/calibrations", json=body)

    @_Operation
    def get_calibration(self, profile_id: str) -> Call[CalibrationProfile]:
        """One calibration profile (a host profile's ``status`` and ``progress``)."""
        return Call("GET", f"/v1/calibrations/{profile_id}")

    @_Operation
    def fidelity(self, job: str) -> Call[JobFidelity | None]:
        """The job's ``fidelity`` (``None`` when it is linked to no plan)."""
        return Call("GET", f"/v1/jobs/{job}", member="fidelity")

    @_Operation
    def delete_job(self, job: str) -> Call[None]:
        return Call("DELETE", f"/v1/jobs/{job}")

    # sessions
    @_Operation
    def create_session(self, mesh_id: str, session: Mapping[str, Any]) -> Call[Session]:
        return Call("POST", f"/v1/meshes/{mesh_id}/sessions", json=session)

    @_Operation
    def run_steps(self, session_id: str, request: Mapping[str, Any]) -> Call[StepAnswer]:
        return Call("POST", f"/v1/sessions/{session_id}/steps", json=request)

    @_Operation
    def get_session(self, session_id: str) -> Call[Session]:
        return Call("GET", f"/v1/sessions/{session_id}")

    @_Operation
    def delete_session(self, session_id: str) -> Call[None]:
        return Call("DELETE", f"/v1/sessions/{session_id}")

    # hardware
    @_Operation
    def list_hardware(self) -> Call[HardwareList]:
        return Call("GET", "/v1/hardware")

    @_Operation
    def recommend_meshes(self, request: Mapping[str, Any]) -> Call[Recommendations]:
        return Call("POST", "/v1/recommendations", json=request)

    @_Operation
    def list_models(self) -> Call[NamedModelList]:
        return Call("GET", "/v1/models")

    @_Operation
    def launch(
        self,
        plan_id: str,
        target: str,
        *,
        image: str | None = None,
        command: Sequence[str] | None = None,
        name: str | None = None,
        queue: str | None = None,
        extra_args: Sequence[str] | None = None,
        extra_env: Mapping[str, str] | None = None,
        service_url: str | None = None,
    ) -> Call[LaunchConfig]:
        """The plan's launch config: ``target`` is ``maxtext`` (``args``, ``env``),
        ``jobset`` (``manifest``), ``slurm`` (``script``) or ``env`` (per process);
        ``service_url`` (this service as the job reaches it) is set as ``DATARAX_URL``;
        ``extra_args`` (MaxText ``key=value``) and ``extra_env`` come after the generated
        ones."""
        body: dict[str, Any] = {"target": target}
        for key, value in (("image", image), ("command", command), ("name", name),
                           ("queue", queue), ("extra_args", extra_args),
                           ("service_url", service_url)):  # fmt: skip
            if value is not None:
                body[key] = list(value) if key in ("command", "extra_args") else value
        if extra_env is not None:
            body["extra_env"] = dict(extra_env)
        return Call("POST", f"/v1/meshes/{plan_id}/launch", json=body)


class Client(_Api):
    """A blocking client.

    Args:
      base_url: e.g. ``http://127.0.0.1:8000``; default ``DATARAX_URL`` (which the
        service's launch configs set when given ``service_url``).
      token: the bearer token (default: ``DATARAX_API_TOKEN``, if set).
      retries: retries of 503/429 answers and lost connections.
      backoff_s: first retry delay without ``Retry-After``; doubles each time.
      timeout_s: per request.
      transport: an ``httpx`` transport (tests).
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        token: str | None = None,
        retries: int = 5,
        backoff_s: float = 0.2,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ):
        self.retries = retries
        self.backoff_s = backoff_s
        self._http = httpx.Client(
            base_url=service_url(base_url),
            headers=auth_headers(token),
            timeout=timeout_s,
            transport=transport,
        )

    def _send[T](self, call: Call[T], answer_type: Any = Any) -> T:
        content, headers = call.body()
        attempt = 0
        while True:
            try:
                answer = self._http.request(
                    call.method, call.path, params=call.params, content=content, headers=headers
                )
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as err:
                lost = not isinstance(err, httpx.ConnectError)
                if attempt >= self.retries or (lost and not call.retry_lost_answer()):
                    raise
                time.sleep(retry_delay(attempt, None, self.backoff_s))
                attempt += 1
                continue
            if answer.status_code in RETRY_STATUSES and attempt < self.retries:
                time.sleep(retry_delay(attempt, answer.headers.get("retry-after"), self.backoff_s))
                attempt += 1
                continue
            raise_for_problem(answer.status_code, answer.headers, answer.content)
            decoded = decode(answer.headers, answer.content)
            if call.member is not None:
                decoded = decoded[call.member]
            parsed: T = decode_answer(answer_type, decoded)  # the call's answer type
            return parsed

    def pusher(
        self,
        job: str,
        *,
        in_flight: int = 2,
        source: str | None = None,
        sources: int | None = None,
        plan: str | None = None,
    ) -> Pusher:
        """Pushes ``job``'s batches in the background, at most ``in_flight`` unanswered
        (:class:`~datarax.client.Pusher`): ``with api.pusher("run-1") as p:
        p.push_arrays(steps, {"loss": losses})``; leaving the block waits for every
        durable answer and raises the first refusal. ``plan`` (default
        ``DATARAX_PLAN_ID``, set by the service's launch configs; ``""``: none): the
        stored plan the job is linked to once its first batch is stored."""
        return Pusher(self, job, in_flight=in_flight, source=source, sources=sources, plan=plan)

    def iter_job_metrics(self, job: str, **query: Any) -> Iterator[HistoryPoint]:
        """Every point of the job's history in step order, page by page (pages cut at
        ``DATARAX_MAX_ANSWER_MB`` included). With ``max_points``, the rows are buckets
        when the service downsampled (:func:`~datarax.client.history_points`)."""
        after = query.pop("after_step", None)
        while True:
            page = self.get_job_metrics(job, after_step=after, **query)
            yield from history_points(page)
            after = page.get("next_after_step")
            if after is None:
                return

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Api):
    """The same operations, awaitable (``await api.push_job_metrics(...)``); arguments as
    :class:`Client`."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        token: str | None = None,
        retries: int = 5,
        backoff_s: float = 0.2,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.retries = retries
        self.backoff_s = backoff_s
        self._http = httpx.AsyncClient(
            base_url=service_url(base_url),
            headers=auth_headers(token),
            timeout=timeout_s,
            transport=transport,
        )

    async def _send[T](self, call: Call[T], answer_type: Any = Any) -> T:
        content, headers = call.body()
        attempt = 0
        while True:
            try:
                answer = await self._http.request(
                    call.method, call.path, params=call.params, content=content, headers=headers
                )
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as err:
                lost = not isinstance(err, httpx.ConnectError)
                if attempt >= self.retries or (lost and not call.retry_lost_answer()):
                    raise
                await asyncio.sleep(retry_delay(attempt, None, self.backoff_s))
                attempt += 1
                continue
            if answer.status_code in RETRY_STATUSES and attempt < self.retries:
                delay = retry_delay(attempt, answer.headers.get("retry-after"), self.backoff_s)
                await asyncio.sleep(delay)
                attempt += 1
                continue
            raise_for_problem(answer.status_code, answer.headers, answer.content)
            decoded = decode(answer.headers, answer.content)
            if call.member is not None:
                decoded = decoded[call.member]
            parsed: T = decode_answer(answer_type, decoded)  # the call's answer type
            return parsed

    def pusher(
        self,
        job: str,
        *,
        in_flight: int = 2,
        source: str | None = None,
        sources: int | None = None,
        plan: str | None = None,
    ) -> AsyncPusher:
        """:meth:`Client.pusher` for this client: ``async with api.pusher("run-1") as p:
        await p.push_arrays(steps, {"loss": losses})``."""
        return AsyncPusher(
            self, job, in_flight=in_flight, source=source, sources=sources, plan=plan
        )

    async def iter_job_metrics(self, job: str, **query: Any) -> AsyncIterator[HistoryPoint]:
        after = query.pop("after_step", None)
        while True:
            page = await self.get_job_metrics(job, after_step=after, **query)
            for point in history_points(page):
                yield point
            after = page.get("next_after_step")
            if after is None:
                return

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
