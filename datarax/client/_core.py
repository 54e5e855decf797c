"""What the sync and async clients share: requests as data, answers, errors, retries."""

from __future__ import annotations

import email.utils
import io
import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

# The answer types' old home (they live in datarax.client.answers now): re-exported.
from datarax.client.answers import BatchResult as BatchResult
from datarax.client.answers import History as History
from datarax.client.answers import HistoryPoint
from datarax.client.answers import JobSummary as JobSummary
from datarax.client.answers import PushResult as PushResult
from datarax.npz import encode_npz

NPZ_MEDIA_TYPE = "application/x-npz"
RETRY_STATUSES = frozenset({429, 503})
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "PATCH", "DELETE"})
MAX_BACKOFF_S = 30.0


class ApiError(Exception):
    """An RFC 9457 problem answered by the service.

    Attributes:
      status: the HTTP status.
      code: the problem's machine-readable ``code`` (e.g. ``"step_conflict"``).
      detail: what was wrong and how to fix it.
      problem: the whole problem document.
    """

    def __init__(self, status: int, code: str, detail: str, problem: Mapping[str, Any]):
        super().__init__(f"{status} {code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.problem = dict(problem)


def history_points(page: Mapping[str, Any]) -> list[HistoryPoint]:
    """The rows of a history answer (a :class:`~datarax.client.History`, or its JSON
    object), whichever kind it is: ``page["points"]``, or, from a service older than
    ``kind`` whose downsampled answer had ``buckets`` only, one row per bucket built the
    way the service builds them (``step``: the newest step with a value, ``reduced``: each
    metric's mean)."""
    points = page.get("points")
    if points is not None:
        return [p if isinstance(p, HistoryPoint) else HistoryPoint.from_json(p) for p in points]
    rows: list[HistoryPoint] = []
    for bucket in page.get("buckets") or []:
        metrics = bucket.get("metrics", {})
        spread = bucket.get("spread")
        rows.append(
            HistoryPoint.from_json(
                {
                    "step": max(
                        (m["last_step"] for m in metrics.values()), default=bucket["end_step"]
                    ),
                    "reduced": {name: m.get("mean") for name, m in metrics.items()},
                    "received_at": None,
                    "complete": True,
                    "sources": None,
                    "start_step": bucket["start_step"],
                    "end_step": bucket["end_step"],
                    "count": max((m.get("count", 0) for m in metrics.values()), default=0),
                    "spread": spread or None,
                }
            )
        )
    return rows


def to_npz(arrays: Mapping[str, Any]) -> bytes:
    """The archive ``np.savez`` writes of ``arrays`` (what npz bodies take), assembled
    directly (:func:`datarax.npz.encode_npz`: a few hundred microseconds where
    ``np.savez`` takes milliseconds)."""
    return encode_npz({name: np.asarray(value) for name, value in arrays.items()})


def from_npz(body: bytes) -> dict[str, np.ndarray]:
    """The arrays of an npz answer (loaded without pickle)."""
    with np.load(io.BytesIO(body), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def jax_sources() -> tuple[str, int] | None:
    """``(str(jax.process_index()), jax.process_count())`` when JAX is imported and runs
    more than one process, else None. Never imports JAX itself."""
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    count = int(jax.process_count())
    return (str(jax.process_index()), count) if count > 1 else None


def _array_default(value: Any) -> Any:
    # What orjson cannot write itself: non-contiguous or exotic numpy arrays, numpy
    # scalars of other kinds, jax.Array and other array-likes.
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "__array__"):
        return np.asarray(value).tolist()
    raise TypeError(f"cannot send a {type(value).__name__} as JSON")


def dumps(value: Any) -> bytes:
    """JSON bytes; numpy arrays written by orjson directly (non-finite floats as null,
    which the service reads as NaN)."""
    return orjson.dumps(
        value,
        default=_array_default,
        option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS,
    )


@dataclass
class Call[T]:
    """One request, as data: what both clients send. ``T`` is the type of its decoded
    answer (:mod:`datarax.client.answers`); ``_send`` returns one."""

    method: str
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    content: bytes | None = None
    content_type: str | None = None
    accept: str | None = None
    idempotent: bool = False
    member: str | None = None
    """The member of the decoded answer the call answers (``None``: all of it)."""

    def retry_lost_answer(self) -> bool:
        return self.idempotent or self.method in IDEMPOTENT_METHODS

    def body(self) -> tuple[bytes | None, dict[str, str]]:
        headers = {}
        if self.accept:
            headers["accept"] = self.accept
        if self.content is not None:
            headers["content-type"] = self.content_type or NPZ_MEDIA_TYPE
            return self.content, headers
        if self.json is not None:
            headers["content-type"] = "application/json"
            return dumps(self.json), headers
        return None, headers


def service_url(base_url: str | None) -> str:
    """``base_url``, else ``DATARAX_URL``.

    Raises:
      ValueError: neither is set.
    """
    found = base_url if base_url is not None else os.environ.get("DATARAX_URL")
    if not found:
        raise ValueError("give the service's base_url, or set DATARAX_URL")
    return found


def auth_headers(token: str | None) -> dict[str, str]:
    token = token if token is not None else os.environ.get("DATARAX_API_TOKEN")
    return {"authorization": f"Bearer {token}"} if token else {}


def retry_delay(attempt: int, retry_after: str | None, backoff_s: float) -> float:
    """Seconds to wait before retry ``attempt`` (0-based): ``Retry-After`` when given,
    else ``backoff_s * 2**attempt``, at most ``MAX_BACKOFF_S``."""
    if retry_after:
        try:
            return min(MAX_BACKOFF_S, max(0.0, float(retry_after)))
        except ValueError:
            when = email.utils.parsedate_to_datetime(retry_after)
            if when is not None:
                return min(MAX_BACKOFF_S, max(0.0, when.timestamp() - time.time()))
    return min(MAX_BACKOFF_S, backoff_s * 2.0**attempt)


def raise_for_problem(status: int, headers: Mapping[str, str], content: bytes) -> None:
    """Raises :class:`ApiError` for a 4xx/5xx answer."""
    if status < 400:
        return
    problem: dict[str, Any]
    try:
        problem = json.loads(content)
        if not isinstance(problem, dict):
            raise ValueError
    except ValueError:
        problem = {"detail": content[:500].decode("utf-8", "replace")}
    code = str(problem.get("code") or f"http_{status}")
    detail = str(problem.get("detail") or headers.get("content-type", ""))
    raise ApiError(status, code, detail, problem)


def decode(headers: Mapping[str, str], content: bytes) -> Any:
    kind = headers.get("content-type", "")
    if kind.startswith(NPZ_MEDIA_TYPE):
        return from_npz(content)
    if not content:
        return None
    if "json" in kind:
        return orjson.loads(content)  # the service writes strict JSON; ~3x json.loads
    return content.decode("utf-8", "replace")


def _push_fields(source: str | None, sources: int | None) -> dict[str, Any]:
    if source is None and sources is None:
        found = jax_sources()
        if found is not None:
            source, sources = found
    out: dict[str, Any] = {}
    if source is not None:
        out["source"] = source
    if sources is not None:
        out["sources"] = sources
    return out


# ----------------------------------------------------------------------- the requests


def _npz_params(reduce: Mapping[str, str] | None, nan_policy: str | None) -> dict[str, Any]:
    """The options of an npz body, as query parameters (``reduce=loss:mean,...``)."""
    params: dict[str, Any] = {}
    if reduce:
        params["reduce"] = ",".join(f"{k}:{v}" for k, v in reduce.items())
    if nan_policy:
        params["nan_policy"] = nan_policy
    return params


def reduce_call(
    metrics: Mapping[str, Any],
    reduce: Mapping[str, str] | None,
    weights: Any,
    nan_policy: str | None,
    npz: bool,
    path: str = "/v1/metrics/reduce",
    extra: Mapping[str, Any] | None = None,
) -> Call[Any]:
    if npz:
        arrays = dict(metrics)
        if weights is not None:
            arrays["_weights"] = weights
        params = {**_npz_params(reduce, nan_policy), **(extra or {})}
        return Call("POST", path, params=params, content=to_npz(arrays), accept=None)
    body: dict[str, Any] = {"metrics": metrics}
    if reduce:
        body["reduce"] = dict(reduce)
    if weights is not None:
        body["weights"] = weights
    if nan_policy:
        body["nan_policy"] = nan_policy
    body.update(extra or {})
    return Call("POST", path, json=body)


def push_call(
    job: str,
    step: int,
    metrics: Mapping[str, Any],
    reduce: Mapping[str, str] | None,
    weights: Any,
    nan_policy: str | None,
    source: str | None,
    sources: int | None,
    npz: bool,
) -> Call[PushResult]:
    extra = {"step": step, **_push_fields(source, sources)}
    call = reduce_call(metrics, reduce, weights, nan_policy, npz, f"/v1/jobs/{job}/metrics", extra)
    call.idempotent = True
    return call


def batch_call(
    job: str, points: list[Mapping[str, Any]], source: str | None, sources: int | None
) -> Call[BatchResult]:
    body: dict[str, Any] = {"points": points, **_push_fields(source, sources)}
    return Call("POST", f"/v1/jobs/{job}/metrics/batch", json=body, idempotent=True)


def arrays_batch_call(
    job: str,
    steps: Any,
    metrics: Mapping[str, Any],
    reduce: Mapping[str, str] | None,
    weights: Any,
    nan_policy: str | None,
    source: str | None,
    sources: int | None,
) -> Call[BatchResult]:
    """A columnar batch as an npz body: ``_step`` ``[P]``, each metric ``[P, n_devices,
    ...]`` (or ``[P]``: one number per point), ``_weights`` ``[P, n_devices]``; the
    reduce call's npz body with the steps beside the metrics."""
    arrays = {"_step": np.asarray(steps, dtype=np.int64)}
    arrays.update((str(name), np.asarray(value)) for name, value in metrics.items())
    path = f"/v1/jobs/{job}/metrics/batch"
    fields = _push_fields(source, sources)
    call = reduce_call(arrays, reduce, weights, nan_policy, True, path, fields)
    call.idempotent = True
    return call


def history_params(**query: Any) -> dict[str, Any]:
    return {
        k: (str(v).lower() if isinstance(v, bool) else v) for k, v in query.items() if v is not None
    }
