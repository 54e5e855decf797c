"""Retention: jobs whose last push is older than ``DATARAX_JOB_RETENTION_DAYS``, and plans
made longer ago than ``DATARAX_PLAN_RETENTION_DAYS`` (but those training sessions are
placed on), are deleted, now and then every hour (a lifespan task)."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

from app.storage import jobs as store_jobs
from app.storage import plans as store_plans
from app.storage.store import Store

log = logging.getLogger("datarax.jobs")

RETENTION_EVERY_S = 3600.0


async def expire_jobs(store: Store, retention_days: float, now: datetime | None = None) -> int:
    """Deletes the jobs whose last push is older than ``retention_days`` (0: none)."""
    if retention_days <= 0:
        return 0
    cutoff = (now or datetime.now(UTC)) - timedelta(days=retention_days)
    stamp = cutoff.strftime("%Y-%m-%dT%H:%M:%SZ")
    removed = 0
    while batch := await store_jobs.expire_pushed_before(store, stamp):
        removed += len(batch)
        log.info("retention: deleted jobs %s (last push before %s)", batch, stamp)
    return removed


async def expire_plans(store: Store, retention_days: float, now: datetime | None = None) -> int:
    """Deletes the plans made longer ago than ``retention_days`` (0: none) that no
    training session is placed on."""
    if retention_days <= 0:
        return 0
    cutoff = (now or datetime.now(UTC)) - timedelta(days=retention_days)
    stamp = cutoff.strftime("%Y-%m-%dT%H:%M:%SZ")  # as plans' created_at (utc_now)
    removed = 0
    while batch := await store_plans.expire_made_before(store, stamp):
        removed += len(batch)
        log.info("retention: deleted plans %s (made before %s)", batch, stamp)
    return removed


async def retention_loop(
    store: Store, retention_days: float, plan_retention_days: float = 0.0
) -> None:
    """Applies retention now and then every hour (a lifespan task)."""
    while True:
        try:
            await expire_jobs(store, retention_days)
            await expire_plans(store, plan_retention_days)
        except Exception:  # keep the loop alive; the error is logged
            log.exception("retention failed")
        await asyncio.sleep(RETENTION_EVERY_S)
