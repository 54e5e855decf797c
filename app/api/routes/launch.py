"""Launching a plan over HTTP: ``POST /v1/meshes/{mesh_id}/launch`` (DESIGN v1.2).

HTTP only; :mod:`app.services.launch` does the work."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Request
from pydantic import Field
from starlette.responses import Response

from app.api.deps import BearerDoc, JsonBody, StoreDep
from app.api.openapi import MeshId, problem_responses
from app.api.routing import JsonBodyRoute, answer_response
from app.schemas.launch import LAUNCH_EXAMPLE, LaunchRequest
from app.services import launch as launching
from datarax.answers.launch import EnvLaunch, JobSetLaunch, MaxTextLaunch, SlurmLaunch

router = APIRouter(tags=["meshes"], route_class=JsonBodyRoute)

YAML = "application/yaml"

TargetConfig = Annotated[
    MaxTextLaunch | JobSetLaunch | SlurmLaunch | EnvLaunch, Field(discriminator="target")
]
"""The answer: the config of the request's ``target`` (:mod:`datarax.answers.launch`)."""


def _wants_yaml(request: Request) -> bool:
    accept = request.headers.get("accept", "")[:1024].lower()
    return YAML in accept or "application/x-yaml" in accept


@router.post(
    "/v1/meshes/{mesh_id}/launch",
    summary="Launch a plan",
    response_class=Response,
    dependencies=[JsonBody, BearerDoc],
    responses={
        200: {
            "model": TargetConfig,
            "description": "the launch config; with Accept: application/yaml a jobset "
            "target answers the manifest as YAML",
            "content": {YAML: {"schema": {"type": "string"}}},
        },
        **problem_responses(401, 404, 413, 415, 422),
    },
)
async def launch_plan(
    mesh_id: MeshId,
    body: Annotated[LaunchRequest, Body(openapi_examples={"jobset": {"value": LAUNCH_EXAMPLE}})],
    store: StoreDep,
    request: Request,
) -> Response:
    """The plan as a job: MaxText's command line and flags (``maxtext``), a GKE JobSet
    (``jobset``), an sbatch script (``slurm``, GPU plans) or what each process passes to
    ``jax.distributed.initialize`` (``env``). 422 ``launch_target_unavailable`` when the
    target does not apply, with the reason; 422 ``not_launchable`` when MaxText's own
    configuration checks would refuse the arguments at start (``extra_args`` included),
    with MaxText's reason and what it would accept."""
    config = await launching.launch(store, mesh_id, body)
    if body.target == "jobset" and _wants_yaml(request):
        from datarax.launch.k8s import to_yaml  # noqa: PLC0415

        return Response(to_yaml(config["manifest"]), media_type=YAML)
    return answer_response(config)
