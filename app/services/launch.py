"""Launch configs of stored plans: the library's :func:`datarax.launch.config.launch_config`
over the plan's stored summary."""

from __future__ import annotations

from typing import Any

import orjson

from app.core.errors import MeshNotFound, ServiceError, from_library
from app.schemas.launch import LaunchRequest
from app.storage import plans as stored_plans
from app.storage.store import Store
from datarax.answers.launch import LaunchConfig
from datarax.errors import PlanError
from datarax.launch.config import launch_config, plan_summary


async def _summary(store: Store, mesh_id: str) -> dict[str, Any]:
    # The stored summary (no device grid, no shards): a few KB even for 65,536 devices,
    # whose whole plan is ~12 MB of JSON.
    text = await stored_plans.get_plan_summary(store, mesh_id)
    if text is None:
        raise MeshNotFound(f"no mesh plan with id {mesh_id!r}; list plans at /v1/meshes")
    return dict(orjson.loads(text))


async def launch(store: Store, mesh_id: str, request: LaunchRequest) -> LaunchConfig:
    """The plan's launch config for the request's target.

    Raises:
      MeshNotFound: no such plan. ServiceError: ``launch_target_unavailable``,
      ``not_launchable`` (what MaxText's configuration checks would refuse) and the
      library's other codes.
    """
    stored = await _summary(store, mesh_id)
    if request.target != "env" and stored.get("serving_estimate") is not None:
        raise ServiceError(
            f"plan {mesh_id!r} is a serving plan, and target {request.target!r} writes a "
            "training job (MaxText's train); serving launch targets (vllm, jetstream) are "
            "not built yet: target env gives its processes' distributed environment",
            code="launch_target_unavailable",
        )
    try:
        return launch_config(
            plan_summary(stored),
            request.target,
            image=request.image,
            command=request.command,
            name=request.name,
            queue=request.queue,
            extra_args=request.extra_args,
            extra_env=request.extra_env,
            service_url=request.service_url,
        )
    except PlanError as error:
        raise from_library(error) from None
