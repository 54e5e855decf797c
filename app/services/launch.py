"""Launch configs of stored plans: the library's :func:`datarax.launch.config.launch_config`
over the plan's stored summary."""

from __future__ import annotations

from typing import Any

import orjson

from app.core.errors import MeshNotFound, from_library
from app.schemas.launch import LaunchRequest
from app.storage import plans as stored_plans
from app.storage.store import Store
from datarax.answers.launch import LaunchConfig
from datarax.errors import PlanError
from datarax.launch.config import launch_config, plan_summary
from datarax.launch.serving import SERVING_TARGETS, serving_launch_config


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
      library's other codes. A serving plan launches with ``vllm``, ``jetstream`` or
      ``jobset`` (:func:`~datarax.launch.serving.serving_launch_config`), or ``env``;
      ``vllm`` and ``jetstream`` on a training plan are ``launch_target_unavailable``.
    """
    stored = await _summary(store, mesh_id)
    serving = stored.get("serving_estimate") is not None
    if request.target != "env" and (serving or request.target in SERVING_TARGETS[:2]):
        build, plan = serving_launch_config, stored
    else:
        build, plan = launch_config, plan_summary(stored)
    try:
        return build(
            plan,
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
