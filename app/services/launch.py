"""Launch configs of stored plans: the library's :func:`datarax.distributed.launch.launch_config`
over the plan's JSON, parsed off the event loop."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

import orjson

from app.errors import from_library
from app.schemas.launch import LaunchRequest
from app.services.meshes import get_plan
from app.store import Store
from datarax.distributed.launch import launch_config, plan_summary
from datarax.distributed.planning import PlanError

_SUMMARIES: OrderedDict[str, dict[str, Any]] = OrderedDict()
_SUMMARY_ENTRIES = 256
"""Plan summaries kept per process (a few KB each): a stored plan never changes, and a
65,536-device plan's JSON takes longer to parse than the launch config takes to build."""


async def _summary(store: Store, mesh_id: str) -> dict[str, Any]:
    if mesh_id in _SUMMARIES:
        _SUMMARIES.move_to_end(mesh_id)
        return _SUMMARIES[mesh_id]
    text = await get_plan(store, mesh_id)
    summary = await asyncio.to_thread(lambda: plan_summary(orjson.loads(text)))
    _SUMMARIES[mesh_id] = summary
    while len(_SUMMARIES) > _SUMMARY_ENTRIES:
        _SUMMARIES.popitem(last=False)
    return summary


def forget(mesh_id: str) -> None:
    """Drops a deleted plan's summary."""
    _SUMMARIES.pop(mesh_id, None)


async def launch(store: Store, mesh_id: str, request: LaunchRequest) -> dict[str, Any]:
    """The plan's launch config for the request's target.

    Raises:
      MeshNotFound: no such plan. ServiceError: ``launch_target_unavailable`` and the
      library's other codes.
    """
    plan = await _summary(store, mesh_id)
    try:
        return launch_config(
            plan,
            request.target,
            image=request.image,
            command=request.command,
            name=request.name,
            queue=request.queue,
        )
    except PlanError as error:
        raise from_library(error) from None
