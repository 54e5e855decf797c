"""The service's one error model: every problem code it can answer, and the errors that carry them.

Every 4xx/5xx answer is RFC 9457 problem details (``application/problem+json``)::

    {"type": "urn:datarax:problem:not_enough_devices", "title": "Not enough devices",
     "status": 422, "detail": "mesh {...} needs 16 devices but only 8 are available",
     "code": "not_enough_devices"}

:data:`CODES` is the single table of codes: status, title and meaning. A
:class:`ServiceError` names its code; status and title come from the table, so one code
always answers alike. Both processes raise these errors: the HTTP process's handlers
(:mod:`app.api.middleware`) turn them into answers, and the runtime process sends them over
the channel as ``to_reply()`` dicts, which :func:`from_reply` turns back into the same
error in the HTTP process. The library's ``PlanError`` and ``MetricsError`` carry codes of
this table too (:func:`from_library`).

Nothing here imports FastAPI or JAX: the runtime process imports this module.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from datarax.names import did_you_mean

PROBLEM_MEDIA_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:datarax:problem:"


@dataclass(frozen=True)
class Code:
    """One problem code: the HTTP status it answers with, its title, what it means."""

    status: int
    title: str
    meaning: str


def _codes(*rows: tuple[str, int, str, str]) -> dict[str, Code]:
    return {code: Code(status, title, meaning) for code, status, title, meaning in rows}


CODES: dict[str, Code] = _codes(
    # --- HTTP and request shape
    ("bad_request", 400, "Bad request", "a request the server could not parse (Content-Length)"),
    ("unauthorized", 401, "Unauthorized", "missing or wrong bearer token (DATARAX_API_TOKEN)"),
    ("not_found", 404, "Not Found", "no such path"),
    ("method_not_allowed", 405, "Method Not Allowed", "the path exists; the method does not"),
    ("payload_too_large", 413, "Payload too large", "body or decompressed npz above the limit"),
    ("headers_too_large", 431, "Request header fields too large", "see DATARAX_MAX_HEADER_KB"),
    ("unsupported_media_type", 415, "Unsupported media type", "body neither JSON nor npz"),
    ("validation_error", 422, "Request validation failed", "schema violation; see errors"),
    ("invalid_json", 422, "Malformed JSON body", "the body is not parseable JSON"),
    ("invalid_request", 422, "Invalid request", "a value the runtime refused"),
    ("answer_too_large", 422, "Answer too large", "the answer would pass DATARAX_MAX_ANSWER_MB"),
    # --- arrays in bodies (metrics and training batches alike)
    ("invalid_tensor", 422, "Invalid tensor", "bad OIP tensor or array (shape vs data, rank 0)"),
    ("ragged_array", 422, "Ragged array", "nested lists that are not rectangular"),
    ("unsupported_datatype", 422, "Unsupported tensor datatype", "e.g. BF16 or BYTES"),
    ("invalid_npz", 422, "Invalid npz body", "an npz that cannot be read without pickle"),
    ("unsupported_dtype", 422, "Array not accepted", "a dtype that cannot cross the channel"),
    ("invalid_array", 422, "Array not accepted", "a malformed array description"),
    # --- plans (the library's PlanError)
    ("mesh_not_found", 404, "Mesh plan not found", "no stored plan with that id"),
    ("not_enough_devices", 422, "Invalid mesh plan", "the mesh needs more devices than exist"),
    ("axes_product_mismatch", 422, "Invalid mesh plan", "axes do not multiply to the devices"),
    ("multiple_auto_axes", 422, "Invalid mesh plan", "more than one axis of size -1"),
    ("invalid_axis_name", 422, "Invalid mesh plan", "an axis name that is not an identifier"),
    ("invalid_axis_size", 422, "Invalid mesh plan", "an axis size below 1 (other than -1)"),
    ("too_many_axes", 422, "Invalid mesh plan", "more than 64 mesh axes (numpy's limit)"),
    ("invalid_device_count", 422, "Invalid mesh plan", "a device count below 1"),
    ("batch_not_divisible", 422, "Invalid mesh plan", "the batch does not split evenly"),
    ("unknown_batch_axis", 422, "Invalid mesh plan", "a batch axis the mesh does not have"),
    ("duplicate_batch_axis", 422, "Invalid mesh plan", "a batch axis named twice"),
    (
        "invalid_batch_shape",
        422,
        "Invalid mesh plan",
        "a batch shape with a size below 1, or a transformer's that is not [global "
        "sequences, sequence length] (a model seq_len that differs from batch_shape[1])",
    ),
    # --- hardware plans and recommendations (the library's PlanError)
    ("hardware_not_found", 404, "Hardware not found", "no catalog entry with that name"),
    ("unknown_hardware", 422, "Invalid hardware plan", "a hardware name not in /v1/hardware"),
    ("invalid_topology", 422, "Invalid hardware plan", "a topology the hardware does not take"),
    ("missing_topology", 422, "Invalid hardware plan", "a TPU plan without a topology"),
    ("option_not_applicable", 422, "Invalid hardware plan", "e.g. hosts on TPU, slices on GPU"),
    ("invalid_slice_count", 422, "Invalid hardware plan", "slices below 1"),
    ("invalid_host_count", 422, "Invalid hardware plan", "hosts that fill no whole domain"),
    ("unknown_dcn_axis", 422, "Invalid hardware plan", "a dcn axis that is not an ici axis"),
    ("physical_axes_split_required", 422, "Invalid hardware plan", "JAX would refuse the order"),
    ("device_mesh_unsupported", 422, "Invalid hardware plan", "a mesh JAX cannot lay out"),
    ("invalid_model", 422, "Invalid model", "a model spec with bad sizes"),
    ("invalid_serving", 422, "Invalid serving plan", "serving options no engine can run"),
    ("unknown_model", 422, "Invalid model", "a model name that GET /v1/models does not list"),
    ("model_not_found", 404, "Model not found", "no named model with that name"),
    ("calibration_not_found", 404, "Calibration not found", "no calibration profile with that id"),
    (
        "unknown_calibration",
        422,
        "Invalid calibration",
        "a calibration that GET /v1/calibrations does not list",
    ),
    (
        "invalid_calibration",
        422,
        "Invalid calibration",
        "a calibration profile of another accelerator kind than the plan's hardware, one "
        "still measuring or failed, or a host calibration of devices the catalog does not "
        "describe",
    ),
    ("launch_target_unavailable", 422, "Cannot launch", "a target that does not apply here"),
    (
        "not_launchable",
        422,
        "Not launchable",
        "a launch MaxText's own configuration checks would refuse at start; the detail "
        "quotes MaxText's reason and what it would accept",
    ),
    ("invalid_maxtext_config", 422, "Invalid MaxText config", "MaxText keys we cannot plan"),
    ("unknown_axis_role", 422, "Invalid hardware plan", "an axis whose role is not known"),
    ("invalid_parallelism", 422, "Invalid hardware plan", "a kind not priced or not applying"),
    ("tensor_not_divisible", 422, "Invalid hardware plan", "tensor axis does not divide heads"),
    ("unknown_optimizer", 422, "Invalid model", "an optimizer other than adam/adamw/sgd"),
    ("invalid_top_k", 422, "Invalid recommendation request", "top_k below 1"),
    ("no_plan_fits", 422, "No plan fits", "no factorisation fits; the detail says what would"),
    ("search_space_too_large", 422, "Search space too large", "past DATARAX_MAX_SEARCH_SPACE"),
    ("too_many_devices", 422, "Too many devices", "a hardware cluster above 262,144 devices"),
    # --- metrics (the library's MetricsError, and the service's own)
    ("unknown_reduce_op", 422, "Invalid metrics", "an op other than mean, sum, max, min"),
    ("unknown_nan_policy", 422, "Invalid metrics", "a policy other than propagate/omit/raise"),
    ("unknown_metric", 422, "Invalid metrics", "reduce names a metric that was not sent"),
    ("device_count_mismatch", 422, "Invalid metrics", "metrics disagree on the device count"),
    ("empty_metrics", 422, "Invalid metrics", "no metric was sent"),
    ("weights_mismatch", 422, "Invalid metrics", "weights do not match the device count"),
    ("invalid_weights", 422, "Invalid metrics", "negative, non-finite or all-zero weights"),
    ("non_finite_values", 422, "Invalid metrics", "NaN/Inf with nan_policy raise"),
    ("nan_policy_traced", 422, "Invalid metrics", "nan_policy raise on traced values"),
    ("integer_overflow", 422, "Invalid metrics", "an integer result beyond its dtype's range"),
    ("unbound_axis_name", 422, "Invalid metrics", "a collective outside pmap/shard_map"),
    ("too_many_metrics", 422, "Too many metrics", "a job point with more than 1,000 metrics"),
    ("value_too_large", 422, "Value too large", "a job point past DATARAX_MAX_POINT_VALUES"),
    ("metric_name_too_long", 422, "Metric name too long", "a metric name over 250 chars"),
    (
        "invalid_metric_name",
        422,
        "Invalid metric name",
        "an empty or blank metric name, one with control characters, or a reserved one",
    ),
    ("reserved_metric_name", 422, "Reserved metric name", "_num_devices or a NUL in an npz answer"),
    # --- job metric history
    ("job_not_found", 404, "Job not found", "no stored job with that name"),
    ("step_conflict", 409, "Step conflict", "the step (or the source's part) has other content"),
    (
        "job_not_linked",
        409,
        "Job not linked",
        "the job is linked to no plan (PATCH its plan first)",
    ),
    (
        "job_link_not_found",
        404,
        "Job link not found",
        "DELETE /v1/jobs/{job}/plan of a job linked to no plan",
    ),
    (
        "no_measured_steps",
        409,
        "No measured steps",
        "the job pushed no value of its step-time metric",
    ),
    (
        "calibration_running",
        409,
        "Calibration running",
        "a host calibration is measuring the devices already; its profile shows its progress",
    ),
    (
        "calibration_published",
        409,
        "Published calibration",
        "a published profile ships with the library and cannot be deleted",
    ),
    (
        "calibration_too_large",
        422,
        "Calibration too large",
        "a jobs fit past DATARAX_MAX_CALIBRATION_CELLS grid cells",
    ),
    ("part_mismatch", 422, "Part does not match", "metric names or device count differ"),
    ("sources_mismatch", 422, "Sources do not match", "sources differs from the step's"),
    # --- sessions and training steps
    ("session_not_found", 404, "Session not found", "no stored session with that id"),
    ("plan_not_live", 409, "Plan is not live", "a device operation on an abstract plan"),
    ("devices_changed", 409, "Plan devices not present", "the plan's devices are gone"),
    (
        "session_lost",
        410,
        "Session state lost",
        "not in this replica's runtime: it restarted, or the session lives on another replica",
    ),
    ("session_expired", 410, "Session expired", "no step for DATARAX_SESSION_IDLE_S; freed"),
    ("too_many_sessions", 429, "Too many sessions", "DATARAX_MAX_SESSIONS live; delete one"),
    ("invalid_strategy", 422, "Invalid strategy", "collective needs replicated parameters"),
    ("insufficient_memory", 422, "Not enough device memory", "beyond the memory budget"),
    ("missing_inputs", 422, "Batch has no inputs", "a batch without 'inputs'"),
    ("missing_targets", 422, "Batch has no targets", "a batch without 'targets'"),
    ("invalid_inputs", 422, "Invalid inputs", "inputs that are not numeric"),
    ("invalid_targets", 422, "Invalid targets", "targets that are not valid class ids"),
    ("batch_shape_mismatch", 422, "Batch does not fit the model", "wrong feature sizes"),
    # --- compile checks
    ("compile_check_not_found", 404, "Compile check not found", "no compile check with that id"),
    ("compile_queue_full", 429, "Compile queue full", "too many checks waiting; see Retry-After"),
    ("compile_target_unavailable", 422, "Cannot compile here", "no compiler for the plan's target"),
    (
        "model_too_large",
        422,
        "Model too large to compile",
        "XLA cannot lower or compile the step, or an array of it passes 2**31 - 1 elements",
    ),
    ("compile_failed", 500, "Compile check failed", "worker crashed, out of memory or timed out"),
    # --- the runtime
    ("internal_error", 500, "Internal server error", "a bug; the detail has no traceback"),
    ("runtime_error", 500, "Runtime error", "a device command failed unexpectedly"),
    ("runtime_diverged", 500, "Runtime processes diverged", "multi-host processes disagreed"),
    ("unknown_command", 400, "Unknown runtime command", "a command the runtime does not serve"),
    ("not_leader", 409, "Not the leader", "a group command sent to a follower's runtime"),
    ("worker_lost", 503, "Device runtime unavailable", "the runtime died or is restarting"),
    ("not_ready", 503, "Service not ready", "the service is still starting"),
    ("step_timeout", 504, "Device command timed out", "a device command ran too long"),
    ("shutting_down", 503, "Service shutting down", "the request met the shutdown grace period"),
    ("busy", 503, "Busy", "every heavy-work slot and queue place taken; see Retry-After"),
    ("request_abandoned", 499, "Client closed request", "the client left; its work was stopped"),
    ("request_timeout", 408, "Request timeout", "a request's head or body stopped arriving"),
    (
        "too_many_connections",
        503,
        "Too many connections",
        "every connection within DATARAX_MAX_CONNECTIONS has a request in progress",
    ),
    ("storage_full", 507, "Storage full", "the database disk is full; nothing was written"),
    ("storage_unavailable", 503, "Storage unavailable", "the database cannot be written now"),
)
"""Every problem ``code`` the service can answer. docs/ERRORS.md's table lists the same."""


_STATUS_FALLBACK = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    503: "worker_lost",
}


def code_for_status(status: int) -> str:
    """The generic code of an HTTP status (framework errors without a domain code)."""
    return _STATUS_FALLBACK.get(status, "internal_error" if status >= 500 else "bad_request")


class ServiceError(Exception):
    """Base of every error the service answers on purpose.

    Subclasses name a ``code`` of :data:`CODES`; status and title come from there. An
    instance may name another code of the same family (``InvalidBatch(..., code=
    "missing_targets")``).

    Args:
      detail: what was received and how to fix it.
      code: overrides the class's code; must be in :data:`CODES`.
      extra: extension members of the problem body (e.g. ``errors``).
      headers: HTTP headers of the answer (e.g. ``WWW-Authenticate``).
    """

    code: str = "internal_error"

    def __init__(
        self,
        detail: str,
        *,
        code: str | None = None,
        extra: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        super().__init__(detail)
        code = code or type(self).code
        if code not in CODES:
            raise KeyError(f"problem code {code!r} is not in app.core.errors.CODES")
        self.code = code
        self.status = CODES[code].status
        self.title = CODES[code].title
        self.detail = detail
        self.extra = dict(extra or {})
        self.headers = dict(headers or {})

    def problem(self) -> dict[str, Any]:
        """The problem-details body."""
        return problem_body(self.status, self.code, self.detail, title=self.title, **self.extra)

    def to_reply(self) -> dict[str, Any]:
        """What crosses the runtime channel (:func:`from_reply` reads it back)."""
        return {
            "status": self.status,
            "code": self.code,
            "title": self.title,
            "detail": self.detail,
            "extra": self.extra,
        }


class BadRequest(ServiceError):
    code = "bad_request"


class Unauthorized(ServiceError):
    code = "unauthorized"

    def __init__(self, detail: str):
        super().__init__(detail, headers={"WWW-Authenticate": 'Bearer realm="datarax"'})


class MeshNotFound(ServiceError):
    code = "mesh_not_found"


class SessionNotFound(ServiceError):
    code = "session_not_found"


class SessionLost(ServiceError):
    code = "session_lost"


class SessionExpired(ServiceError):
    code = "session_expired"


class TooManySessions(ServiceError):
    code = "too_many_sessions"


class PlanNotLive(ServiceError):
    code = "plan_not_live"


class PayloadTooLarge(ServiceError):
    code = "payload_too_large"


class UnsupportedMediaType(ServiceError):
    code = "unsupported_media_type"


class InvalidJson(ServiceError):
    code = "invalid_json"


class InvalidRequest(ServiceError):
    code = "invalid_request"


class InvalidParameter(ServiceError):
    """A query or body value that fails validation outside the pydantic models."""

    code = "validation_error"

    def __init__(self, loc: Sequence[str | int], msg: str, *, error_type: str = "value_error"):
        entry = error_entry(loc, msg, error_type)
        super().__init__(f"{dotted(loc)}: {msg}", extra={"errors": [entry]})


class InvalidTensor(ServiceError):
    code = "invalid_tensor"


class RaggedArray(ServiceError):
    code = "ragged_array"


class UnsupportedDatatype(ServiceError):
    code = "unsupported_datatype"


class InvalidNpz(ServiceError):
    code = "invalid_npz"


class ArrayNotAccepted(ServiceError):
    """An array that cannot cross the runtime channel (``unsupported_dtype``, ``invalid_array``)."""

    code = "invalid_array"


class ReservedMetricName(ServiceError):
    code = "reserved_metric_name"


class JobNotFound(ServiceError):
    code = "job_not_found"


class StepConflict(ServiceError):
    code = "step_conflict"


class JobNotLinked(ServiceError):
    code = "job_not_linked"


class JobLinkNotFound(ServiceError):
    code = "job_link_not_found"


class NoMeasuredSteps(ServiceError):
    code = "no_measured_steps"


class CalibrationRunning(ServiceError):
    code = "calibration_running"


class PartMismatch(ServiceError):
    code = "part_mismatch"


class SourcesMismatch(ServiceError):
    code = "sources_mismatch"


class InvalidBatch(ServiceError):
    """A training batch the session cannot take; the code says why."""

    code = "batch_shape_mismatch"


class InsufficientMemory(ServiceError):
    code = "insufficient_memory"


class InvalidStrategy(ServiceError):
    code = "invalid_strategy"


class DevicesChanged(ServiceError):
    code = "devices_changed"


class UnknownCommand(ServiceError):
    code = "unknown_command"


class NotLeader(ServiceError):
    code = "not_leader"


class RuntimeFailed(ServiceError):
    """A runtime command raised something unexpected; the detail names it."""

    code = "runtime_error"


class RuntimeDiverged(ServiceError):
    code = "runtime_diverged"


class WorkerLost(ServiceError):
    """The runtime process died or is not up (yet)."""

    code = "worker_lost"


class NotReady(ServiceError):
    code = "not_ready"


class AnswerTooLarge(ServiceError):
    code = "answer_too_large"


class ShuttingDown(ServiceError):
    code = "shutting_down"


class StorageFull(ServiceError):
    code = "storage_full"


class StorageUnavailable(ServiceError):
    """The database cannot be written (read-only file or directory, I/O error); retry."""

    code = "storage_unavailable"


class CompileCheckNotFound(ServiceError):
    code = "compile_check_not_found"


class CompileQueueFull(ServiceError):
    code = "compile_queue_full"


class CompileTargetUnavailable(ServiceError):
    code = "compile_target_unavailable"


class StepTimeout(ServiceError):
    """A runtime call ran past its timeout; the runtime was killed and is restarting."""

    code = "step_timeout"


def from_reply(error: Mapping[str, Any]) -> ServiceError:
    """The :class:`ServiceError` of a runtime error reply (``ServiceError.to_reply()``).

    A code outside :data:`CODES` (a runtime of another version) answers as
    ``runtime_error`` with the original code named in the detail.
    """
    code = str(error.get("code", "runtime_error"))
    detail = str(error.get("detail", ""))
    extra = error.get("extra") if isinstance(error.get("extra"), Mapping) else None
    if code not in CODES:
        return RuntimeFailed(f"{code}: {detail}")
    return ServiceError(detail, code=code, extra=extra)


def from_library(exc: Exception) -> ServiceError:
    """The :class:`ServiceError` of a library ``PlanError`` or ``MetricsError``.

    Both are ``ValueError`` s with ``code`` and ``message``; every code they raise is in
    :data:`CODES` (a test checks it), anything else is ``invalid_request``.
    """
    code = getattr(exc, "code", None)
    # a PlanError's http_message leaves out what only Python callers can do
    message = str(getattr(exc, "http_message", None) or getattr(exc, "message", None) or exc)
    if not isinstance(code, str) or code not in CODES:
        return InvalidRequest(message)
    return ServiceError(message, code=code)


# --------------------------------------------------------------------------- rendering


def problem_body(
    status: int, code: str, detail: str, *, title: str | None = None, **extra: Any
) -> dict[str, Any]:
    """The problem-details object (a plain dict)."""
    body = {
        "type": TYPE_PREFIX + code,
        "title": title or (CODES[code].title if code in CODES else code.replace("_", " ")),
        "status": status,
        "detail": detail,
        "code": code,
    }
    body.update(extra)
    return body


def problem_bytes(status: int, code: str, detail: str, **extra: Any) -> bytes:
    """The encoded problem body (strict JSON)."""
    body = problem_body(status, code, detail, **extra)
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def dotted(loc: Sequence[str | int]) -> str:
    return ".".join(str(part) for part in loc)


UNION_TAGS = frozenset({"mlp", "transformer", "named", "live", "abstract", "hardware", "host",
                        "jobs"})  # fmt: skip
"""The tags of the request schemas' discriminated unions (``Tag(...)`` and the ``kind``
of ``POST /v1/calibrations``): pydantic puts the chosen member's tag in an error's
``loc``; a request has no such field."""


def clean_loc(loc: Sequence[str | int]) -> list[str | int]:
    """``loc`` as the request spells it: without pydantic's union members, neither its
    generated ones (``list[any]``, ``function-after[...]``, a class name such as
    ``Tensor``) nor a discriminated union's tag between a field (or the body) and the
    member's own field (``model.named.remat`` is ``model.remat``)."""
    out: list[str | int] = []
    for i, part in enumerate(loc):
        if isinstance(part, str):
            generated = any(c in part for c in "[(") or part[:1].isupper()
            tag = part in UNION_TAGS and i + 1 < len(loc) and i > 0
            if generated or (tag and (loc[i - 1] in ("body", "model"))):
                continue
        out.append(part)
    return out


def error_entry(loc: Sequence[str | int], msg: str, error_type: str) -> dict[str, Any]:
    """One ``errors`` entry: ``loc`` (full location), ``field`` (dotted, inside it), ``msg``,
    ``type``."""
    loc = list(loc)
    inner = loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc
    return {"loc": loc, "field": dotted(inner), "msg": msg, "type": error_type}


def _readable(
    err: Mapping[str, Any], error_type: str, field: str, vocabulary: Iterable[str]
) -> str:
    """pydantic's message in the service's words: no ``Value error, `` prefix; a field
    the schema does not have names the nearest one it does, and a value outside a fixed
    set the nearest value in it."""
    msg = str(err.get("msg", "")).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if error_type in ("extra_forbidden", "unexpected_keyword_argument"):
        # (the second: a member a dataclass the body parses into does not have)
        name = field.rsplit(".", 1)[-1]
        if name in vocabulary:  # a field of another mode or object, not of this one
            return f"{name!r} is not a field here (it is one of another kind of body or object)"
        return f"{name!r} is not a field here{did_you_mean(name, vocabulary)}"
    if error_type in ("literal_error", "enum"):
        expected = str((err.get("ctx") or {}).get("expected", ""))
        return msg + did_you_mean(err.get("input"), re.findall(r"'([^']*)'", expected))
    return msg


def validation_error(
    errors: Sequence[Mapping[str, Any]], vocabulary: Iterable[str] = ()
) -> ServiceError:
    """The problem of pydantic/FastAPI validation errors: 422 ``validation_error`` whose
    ``errors`` name every field (as the request spells it: :func:`clean_loc`), or
    ``invalid_json`` for a body that is not JSON. ``vocabulary``: the field names the
    request schemas have, for the nearest name to a field they do not
    (:func:`_readable`)."""
    for err in errors:
        if err.get("type") == "json_invalid":
            reason = (err.get("ctx") or {}).get("error", "JSON decode error")
            position = err.get("loc", ("body", "?"))[-1]
            return InvalidJson(
                f"request body is not valid JSON ({reason} at character {position}); "
                "send a JSON object with Content-Type: application/json"
            )
    names = list(vocabulary)
    entries = []
    seen = set()
    for err in errors:
        loc = clean_loc(err.get("loc", ()))
        error_type = str(err.get("type", ""))
        entry = error_entry(loc, "", error_type)
        entry["msg"] = _readable(err, error_type, entry["field"], names)
        # one union's members refusing the same field: once, the first member's words
        if (entry["field"], error_type) not in seen:
            seen.add((entry["field"], error_type))
            entries.append(entry)
    first = entries[0] if entries else {"loc": [], "msg": "invalid request"}
    more = f" (and {len(entries) - 1} more)" if len(entries) > 1 else ""
    return ServiceError(
        f"{dotted(first['loc'])}: {first['msg']}{more}",
        code="validation_error",
        extra={"errors": entries},
    )
