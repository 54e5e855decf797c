"""The host calibration's runtime command, ``calibration_measure``: one stage of
:mod:`datarax.estimate.host_calibration` on this runtime's local devices.

Loaded by every runtime (:data:`app.runtime.server.BUILTIN_MODULES`); JAX is imported
inside the handler. The service runs the stages one command at a time
(:mod:`app.services.host_calibration`), so a calibration's progress is visible between
them and a training step queued behind it waits for one stage, not the whole run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.core.errors import InvalidRequest
from app.runtime.server import command


@command("calibration_measure", local=True)
def calibration_measure(
    payload: dict[str, Any],
    arrays: dict[str, np.ndarray],  # noqa: ARG001
) -> tuple[dict, dict]:
    """``{"stage", "quick"}`` -> ``{"rows", "device_kind", "platform", "devices",
    "jax", "jaxlib"}``: the stage's measurement rows on every local device."""
    import jax
    import jaxlib

    from datarax.estimate.host_calibration import STAGES, measure_stage

    stage = payload.get("stage")
    if stage not in STAGES:
        raise InvalidRequest(f"calibration stage {stage!r} is not one of {list(STAGES)}")
    devices = jax.local_devices()
    rows = measure_stage(str(stage), quick=bool(payload.get("quick", True)), devices=devices)
    return {
        "rows": rows,
        "device_kind": devices[0].device_kind,
        "platform": devices[0].platform,
        "devices": len(devices),
        "jax": jax.__version__,
        "jaxlib": getattr(jaxlib, "__version__", None),
    }, {}
