"""Compile checks: XLA's own verdict on a plan, from a supervised compile worker.

- :mod:`.targets`: what the worker compiles for a plan, and the cache key of its result;
- :mod:`.results`: ``fits`` judged here, and the estimate against XLA;
- :mod:`.queue`: the checks waiting, bounded;
- :mod:`.service`: :class:`CompileChecks`, the checks' lifecycle over the queue, the
  worker (:mod:`app.workers.compile_worker`) and the store
  (:mod:`app.storage.compile_checks`).
"""

from app.services.compile_checks.results import estimate_error, judge_fits
from app.services.compile_checks.service import CompileChecks
from app.services.compile_checks.targets import (
    cache_key,
    check_target,
    compiler_versions,
    cpu_device_bound,
    gpu_platform,
    needs_gpu,
    worker_platform,
)
from app.workers.supervisor import group_rss_bytes

__all__ = [
    "CompileChecks",
    "cache_key",
    "check_target",
    "compiler_versions",
    "cpu_device_bound",
    "estimate_error",
    "gpu_platform",
    "group_rss_bytes",
    "judge_fits",
    "needs_gpu",
    "worker_platform",
]
