"""Service settings: CLI flags and ``DATARAX_*`` environment variables (pydantic-settings)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
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
    heartbeat_s: float = Field(10.0, gt=0, le=30, description="lost-peer detection bound")
    platforms: str | None = Field(None, description="JAX_PLATFORMS for the runtime, e.g. 'cpu'")
    test_commands: bool = Field(False, description="enable runtime commands used only by tests")
    # multi-host (one JAX distributed runtime across processes)
    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None

    @property
    def data_dir(self) -> Path:
        """Directory beside the database: compile cache, checkpoints."""
        return self.db.parent

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 1024 * 1024)
