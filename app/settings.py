"""Service settings: ``DATARAX_*`` environment variables, and CLI flags (:mod:`app.cli`), both
through pydantic-settings."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every knob of the service. Environment variables use the ``DATARAX_`` prefix.

    Secrets (``api_token``) have no default: without one the API is open, which is the
    right default for a service bound to 127.0.0.1 and the wrong one anywhere else.
    """

    model_config = SettingsConfigDict(env_prefix="DATARAX_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8000
    db: Path = Field(Path("./var/datarax.sqlite"), description="SQLite file (WAL mode)")
    cpu_devices: int = Field(8, ge=1, le=4096, description="simulated devices on CPU-only hosts")
    max_body_mb: float = Field(64.0, gt=0, description="request bodies above this are 413")
    api_token: SecretStr | None = Field(None, description="Bearer token for POST and DELETE")
    step_timeout_s: float = Field(120.0, gt=0, description="runtime calls longer than this: 504")
    runtime_start_timeout_s: float = Field(180.0, gt=0)
    max_steps_per_call: int = Field(1000, ge=1)
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
    heartbeat_s: float = Field(10.0, gt=0, le=30, description="lost-peer detection bound")
    platforms: str | None = Field(None, description="JAX_PLATFORMS for the runtime, e.g. 'cpu'")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="log level of the service and uvicorn"
    )
    # multi-host (one JAX distributed runtime across processes): see app/runtime/group.py
    coordinator: str | None = Field(None, description="JAX coordinator HOST:PORT (process 0)")
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
    def data_dir(self) -> Path:
        """Directory beside the database: compile cache, checkpoints."""
        return self.db.parent

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 1024 * 1024)
