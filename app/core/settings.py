"""Service settings: ``DATARAX_*`` environment variables, and CLI flags (:mod:`app.cli`), both
through pydantic-settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.core.database_url import is_postgres_url, redact


class Settings(BaseSettings):
    """Every knob of the service. Environment variables use the ``DATARAX_`` prefix.

    Secrets (``api_token``) have no default: without one the API is open, which is the
    right default for a service bound to 127.0.0.1 and the wrong one anywhere else.
    """

    # Every number finite: an infinite timeout or body limit starts a service that breaks.
    model_config = SettingsConfigDict(env_prefix="DATARAX_", extra="ignore", allow_inf_nan=False)

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port")
    db: Path = Field(Path("./var/datarax.sqlite"), description="SQLite file (WAL mode)")
    database_url: SecretStr | None = Field(
        None,
        description="a postgresql:// URL: store everything in that PostgreSQL database "
        "instead of the SQLite file, shared by every service process given the same URL "
        "(replicas); a password is better kept in PGPASSWORD or ~/.pgpass than in the URL",
    )
    cpu_devices: int = Field(8, ge=1, le=4096, description="simulated devices on CPU-only hosts")
    max_body_mb: float = Field(64.0, gt=0, description="request bodies above this are 413")
    malloc_keep_mb: float = Field(
        256.0,
        ge=0,
        le=2047,
        description="freed memory the HTTP process keeps for reuse by large requests (MiB); "
        "more goes back to the kernel within a second, and all of it after 5 s idle; "
        "0: glibc's defaults",
    )
    max_header_kb: float = Field(
        64.0,
        gt=0,
        le=1024,
        description="request line and headers above this (KiB, all together) are 431 "
        "headers_too_large, refused before they are held",
    )
    max_headers: int = Field(
        100, ge=8, le=10_000, description="requests with more header fields are 431"
    )
    api_token: SecretStr | None = Field(None, description="Bearer token for POST and DELETE")
    auth_reads: bool = Field(
        False,
        description="with a token set, /v1 reads (GET, HEAD) need it too; health, "
        "/metrics and the docs stay open",
    )
    max_point_values: int = Field(
        4096,
        ge=1,
        le=1_000_000,
        description="numbers one stored job point's reduced values may hold, all metrics "
        "together; a push beyond it is 422 value_too_large",
    )
    max_answer_mb: float = Field(
        64.0, gt=0, description="answers that would pass this are refused (422 answer_too_large)"
    )
    shutdown_grace_s: float = Field(
        10.0,
        ge=0,
        le=3600,
        description="on SIGTERM, requests in flight get this long; then 503 shutting_down",
    )
    header_timeout_s: float = Field(
        20.0,
        gt=0,
        le=3600,
        description="a connection sends a whole request head within this; past it 408 "
        "request_timeout (a plain close when nothing arrived)",
    )
    body_timeout_s: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="longest pause between two reads of a request body; past it the "
        "connection closes and the request is 408 request_timeout",
    )
    write_timeout_s: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="longest an answer may wait for a client that does not read it; past "
        "it the connection is dropped",
    )
    keep_alive_s: float = Field(
        5.0, gt=0, le=3600, description="idle kept-alive connections close after this"
    )
    max_connections: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="connections held at once (default: the file-descriptor limit less "
        "160); past it the one idle longest is closed, health checks keep 32 more",
    )
    cors_origins: str = Field(
        "",
        description="browser origins allowed to call the API (CORS), comma-separated, e.g. "
        "'https://grafana.example:3000'; '*' for any; empty: none (same origin only)",
    )
    step_timeout_s: float = Field(120.0, gt=0, description="runtime calls longer than this: 504")
    runtime_start_timeout_s: float = Field(
        180.0, gt=0, description="seconds the runtime or a compile worker may take to start"
    )
    compile_timeout_s: float = Field(
        600.0, gt=0, description="a compile check running longer is failed (worker killed)"
    )
    compile_queue: int = Field(
        16, ge=1, le=1024, description="compile checks waiting at most; more are 429"
    )
    compile_memory_mb: int = Field(
        16384,
        ge=0,
        description=(
            "memory cap of the compile worker: address space (RLIMIT_AS) on CPU, resident "
            "memory on a GPU (0: none)"
        ),
    )
    max_steps_per_call: int = Field(
        1000, ge=1, description="training steps one request may run; more are 422"
    )
    heavy_workers: int = Field(
        2,
        ge=1,
        le=64,
        description="CPU-heavy requests (recommendations, plans over 4,096 devices) run at "
        "most this many at once, on threads apart from the store's and health's",
    )
    heavy_queue: int = Field(
        8,
        ge=0,
        le=1024,
        description="heavy requests waiting for a slot at most; more are 503 busy",
    )
    max_search_space: int = Field(
        20_000,
        ge=1,
        le=10_000_000,
        description="units of work one recommendation may spend, a unit being one (ici, dcn) "
        "candidate of a model of up to 16 parameter groups (more groups: groups / 16 a "
        "candidate); more are 422 search_space_too_large, before any work",
    )
    max_calibration_cells: int = Field(
        20_000_000,
        ge=1,
        le=10**12,
        description="grid cells one jobs calibration may compute (jobs x 23,760 grid points, "
        "twice from 3 jobs for the leave-one-out refits); more are 422 "
        "calibration_too_large, before any work",
    )
    calibrations_keep: int = Field(
        1000,
        ge=1,
        le=1_000_000,
        description="stored calibration profiles kept, newest first; storing one deletes "
        "those past it, but a running one and each device kind's newest done host profile",
    )
    max_sessions: int = Field(
        32, ge=1, le=100_000, description="live training sessions at most; more are 429"
    )
    session_idle_s: float = Field(
        3600.0,
        ge=0,
        description="a session without a step (or its creation) for this long is freed and "
        "answers 410 session_expired; 0: never",
    )
    memory_fraction: float = Field(
        0.8,
        gt=0,
        le=1,
        description="share of device memory (host memory for CPU devices) that sessions may "
        "plan to hold; a session or step beyond it is 422 insufficient_memory",
    )
    memory_budget_mb: float | None = Field(
        None,
        gt=0,
        description="that budget in MiB instead (per accelerator, or for the host's CPU "
        "devices together); set it alike on every host of a group with unequal memory",
    )
    job_retention_days: float = Field(
        0.0,
        ge=0,
        description="delete jobs whose last metric push is older than this (checked "
        "hourly); 0 keeps every job",
    )
    plan_retention_days: float = Field(
        0.0,
        ge=0,
        description="delete plans made longer ago than this (checked hourly), except those "
        "with training sessions; 0 keeps every plan",
    )
    heartbeat_s: float = Field(10.0, gt=0, le=30, description="lost-peer detection bound")
    platforms: str | None = Field(
        None,
        description="JAX_PLATFORMS for the runtime, e.g. 'cpu', 'cuda', 'tpu'; default: "
        "JAX_PLATFORMS if set, else detected (an accelerator with its JAX plugin, else cpu)",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="log level of the service and uvicorn"
    )
    log_format: Literal["json", "text"] = Field(
        "json",
        description="log lines of the service, uvicorn and the runtime: JSON objects, one "
        "a line, or text for people",
    )
    # multi-host (one JAX distributed runtime across processes): see app/runtime/group.py
    coordinator: str | None = Field(None, description="JAX coordinator HOST:PORT (process 0)")
    coordinator_bind_address: str | None = Field(
        None,
        description="HOST:PORT process 0's coordination service listens on (it has no "
        "authentication); default: the coordinator address itself; '[::]:PORT' for every "
        "interface",
    )
    num_processes: int | None = Field(None, ge=1, description="processes in the group")
    process_id: int | None = Field(None, ge=0, description="this process, 0 serves HTTP")
    distributed: bool = Field(
        False,
        description="join a JAX distributed runtime, detecting what is not given "
        "(SLURM, Open MPI, Kubernetes indexed Job/JobSet, Cloud TPU)",
    )
    distributed_init_timeout_s: float = Field(
        120.0,
        gt=0,
        le=3600,
        description="a runtime waits this long for every process to join, then exits "
        "and is restarted",
    )

    @field_validator("api_token")
    @classmethod
    def _token_is_a_token(cls, token: SecretStr | None) -> SecretStr | None:
        if token is not None and not token.get_secret_value().strip():
            raise ValueError(
                "the token is empty or blank: unset DATARAX_API_TOKEN to leave the API open, "
                "or set a token"
            )
        return token

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, url: SecretStr | None) -> SecretStr | None:
        if url is None:
            return None
        text = url.get_secret_value().strip()
        if not text:
            return None  # empty: the SQLite file, as when unset
        if not is_postgres_url(text):
            raise ValueError(
                "expected a postgresql:// URL (postgresql://user@host:5432/dbname); "
                "unset it to use the SQLite file DATARAX_DB"
            )
        return SecretStr(text)

    @model_validator(mode="after")
    def _check_multihost(self) -> Settings:
        given = (self.coordinator, self.num_processes, self.process_id)
        if not self.distributed and any(v is not None for v in given):
            if any(v is None for v in given):
                raise ValueError(
                    "multi-host needs coordinator, num_processes and process_id together "
                    f"(got {given}); or set DATARAX_DISTRIBUTED=true to detect the rest"
                )
        if (
            self.num_processes is not None
            and self.process_id is not None
            and self.process_id >= self.num_processes
        ):
            raise ValueError(
                f"process_id {self.process_id} must be below num_processes {self.num_processes}"
            )
        return self

    @property
    def multihost(self) -> bool:
        """This service is one process of a JAX distributed runtime."""
        return self.distributed or self.coordinator is not None

    @property
    def store_location(self) -> str | Path:
        """Where the store lives: the PostgreSQL URL when one is set, else the SQLite
        file."""
        if self.database_url is not None:
            return self.database_url.get_secret_value()
        return self.db

    @property
    def store_name(self) -> str:
        """The store's location for messages and logs (a URL's password hidden)."""
        if self.database_url is None:
            return str(self.db)
        return redact(self.database_url.get_secret_value())

    @property
    def data_dir(self) -> Path:
        """Directory beside the database: compile cache, checkpoints."""
        return self.db.parent

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 1024 * 1024)

    @property
    def max_header_bytes(self) -> int:
        return int(self.max_header_kb * 1024)

    @property
    def max_answer_bytes(self) -> int:
        return int(self.max_answer_mb * 1024 * 1024)

    def byte_limits(self) -> ByteLimits:
        """The byte caps, computed once for an app (``app.state.byte_limits``)."""
        return ByteLimits(
            body=self.max_body_bytes, header=self.max_header_bytes, answer=self.max_answer_bytes
        )


@dataclass(frozen=True)
class ByteLimits:
    """The byte caps requests check, from :class:`Settings`: built once, read by the
    routes without converting megabytes on every request."""

    body: int
    """``DATARAX_MAX_BODY_MB`` in bytes"""
    header: int
    """``DATARAX_MAX_HEADER_KB`` in bytes"""
    answer: int
    """``DATARAX_MAX_ANSWER_MB`` in bytes"""
