"""Launching a plan (DESIGN v1.2 "Launching a plan"): the request. The answer is
:mod:`datarax.answers.launch`'."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field
from pydantic.config import JsonDict

from app.schemas.base import Strict

LAUNCH_EXAMPLE: JsonDict = {
    "target": "jobset",
    "image": "us-docker.pkg.dev/my-project/maxtext:latest",
    "queue": "tpu-queue",
}


_EXTRA_ARG = Field(
    max_length=4096, pattern=r"^[A-Za-z_][A-Za-z0-9_]*=[^\n\r\x00]*$", description="key=value"
)
_ENV_NAME = Field(max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENV_VALUE = Field(max_length=65_536, pattern=r"^[^\x00]*$")


class LaunchRequest(Strict):
    """What to launch the plan with."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [LAUNCH_EXAMPLE]})

    target: Literal["maxtext", "jobset", "slurm", "env", "vllm", "jetstream"] = Field(
        description="maxtext: command line and flags; jobset: a GKE JobSet; slurm: an sbatch "
        "script (GPU plans); env: what jax.distributed.initialize needs per process; vllm: "
        "the vllm serve command line (serving plans); jetstream: MaxText's serving "
        "configuration (serving plans on TPU)"
    )
    image: str | None = Field(
        None,
        max_length=512,
        pattern=r"^[^\s\x00-\x1f\x7f]+$",
        description="container image (no spaces or control characters)",
    )
    command: list[Annotated[str, Field(max_length=4096, pattern=r"^[^\x00]*$")]] | None = Field(
        None,
        max_length=256,
        description="the container's command (default: MaxText's trainer); no NUL characters",
    )
    name: str | None = Field(
        None,
        max_length=63,
        pattern=r"^[^\x00-\x1f\x7f]*$",
        description="job name (default: the plan's); no control characters",
    )
    queue: str | None = Field(
        None,
        max_length=63,
        pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        description="Kueue queue name (jobset): a Kubernetes label value",
    )
    service_url: str | None = Field(
        None,
        max_length=2048,
        pattern=r"^https?://[^\s]+$",
        description="this service's address as the job reaches it: set as DATARAX_URL, so "
        "that the job's pusher pushes here and links itself to the plan (DATARAX_PLAN_ID)",
    )
    extra_args: list[Annotated[str, _EXTRA_ARG]] | None = Field(
        None,
        max_length=256,
        description="MaxText key=value arguments added after the generated ones (maxtext, "
        "jobset, slurm, jetstream; vllm: key=value as the flag --key value); one naming a "
        "generated key replaces it, and the notes say so",
    )
    extra_env: dict[Annotated[str, _ENV_NAME], Annotated[str, _ENV_VALUE]] | None = Field(
        None,
        max_length=128,
        description="environment variables added after the generated ones (every target); "
        "one naming a generated variable replaces it, and the notes say so",
    )
