"""``POST /v1/calibrations {"kind": "host"}``: the host measures itself (DESIGN v1.3,
"Calibrations").

The profile is stored at once with ``status`` ``running`` (202, ``Location``), then one
runtime command per stage of :mod:`datarax.estimate.host_calibration` measures the
live devices (``calibration_measure``, :mod:`app.runtime.calibration`); after each
stage the profile is rewritten with its ``progress`` and the rows so far, so a client
polling ``GET /v1/calibrations/{id}`` sees it move. The constants are then fitted on
the rows (:func:`~datarax.estimate.host_calibration.fit_host_profile`, in a thread) and
the profile is stored ``done``, with the JAX and jaxlib versions that measured it; or
``failed``, with the ``problem`` that stopped it. One host calibration runs at a time
(409 ``calibration_running``). A profile left ``running`` by a process that stopped is
marked ``failed`` when the next one starts (:meth:`HostCalibrations.recover`).

Time: the stages queue behind other runtime commands (training steps) and each may run
``STAGE_TIMEOUT_S`` at most; quick mode takes about 10 s on a two-core host with 8
simulated CPU devices (BENCHMARKS.md, "Host calibration").
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import UTC, datetime
from typing import Any

import anyio.to_thread
import orjson

from app.core.errors import CalibrationRunning, ServiceError, from_library
from app.storage import calibrations as stored
from app.storage.store import Store
from app.workers.runtime_client import RuntimeClient
from datarax.errors import PlanError
from datarax.estimate.host_fit import STAGES, fit_host_profile
from datarax.hardware.chips import HARDWARE, get_hardware
from datarax.hardware.entry import Hardware

log = logging.getLogger("datarax.calibrations")

STAGE_TIMEOUT_S = 600.0
"""Seconds one stage may run on the runtime (the full mode on a slow host included)."""


def catalog_entry(device_kind: str, platform: str, named: str | None) -> Hardware:
    """The catalog entry the runtime's devices are: ``named`` when given (it must
    describe them), else the entry whose ``device_kind`` they report (``cpu`` for CPU
    devices).

    Raises:
      ServiceError: 422 ``invalid_calibration`` (no entry describes them, or the named one
        does not), ``unknown_hardware``.
    """
    if named is not None:
        try:
            hw = get_hardware(named)
        except PlanError as error:
            raise from_library(error) from None
        if hw.device_kind != device_kind and not (platform == "cpu" and hw.kind == "cpu"):
            raise ServiceError(
                f"hardware {named!r} is {hw.device_kind!r} devices, and the runtime's devices "
                f"are {device_kind!r}: name the entry that describes them, or none",
                code="invalid_calibration",
            )
        return hw
    if platform == "cpu":
        return get_hardware("cpu")
    for hw in HARDWARE.values():
        if hw.device_kind == device_kind:
            return hw
    raise ServiceError(
        f"no catalog entry describes the runtime's {device_kind!r} devices, so there are no "
        "peaks to measure them against: name one with hardware (GET /v1/hardware)",
        code="invalid_calibration",
    )


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class HostCalibrations:
    """The service's host calibrations: at most one measuring at a time."""

    def __init__(self, store: Store, runtime: RuntimeClient) -> None:
        self._store = store
        self._runtime = runtime
        self._task: asyncio.Task[None] | None = None
        self._running: str | None = None

    async def recover(self) -> None:
        """Marks ``failed`` the profiles a stopped process left ``running``."""
        for text in await stored.running_profiles(self._store):
            body = orjson.loads(text)
            body["status"] = "failed"
            body["problem"] = {
                "code": "runtime_error",
                "detail": "the service stopped while this calibration measured; run it again",
            }
            await stored.update_profile(self._store, body["id"], orjson.dumps(body).decode())

    async def start(self, quick: bool, hardware: str | None) -> dict[str, Any]:
        """Stores a ``running`` profile and starts measuring; returns the profile.

        Raises:
          ServiceError: 409 ``calibration_running``; 422 ``invalid_calibration``,
            ``unknown_hardware``; the runtime's own (``worker_lost``) when it is down.
        """
        if self._task is not None and not self._task.done():
            raise CalibrationRunning(
                f"host calibration {self._running!r} is measuring the devices; "
                f"GET /v1/calibrations/{self._running} shows its progress"
            )
        devices, _ = await self._runtime.call("devices")
        device_kind = str(devices["devices"][0]["kind"])
        platform = str(devices["platform"])
        hw = catalog_entry(device_kind, platform, hardware)
        profile_id = f"host-{uuid.uuid4().hex[:12]}"
        body: dict[str, Any] = {
            "id": profile_id,
            "kind": "host",
            "status": "running",
            "created_at": _now(),
            "hardware": hw.name,
            "hardware_kind": hw.kind,
            "device_kind": device_kind,
            "stack": {"framework": "jax", "jax": None, "jaxlib": None, "backend": platform},
            "constants": None,
            "measurements": [],
            "error": None,
            "progress": {"quick": quick, "stages": list(STAGES), "done": [], "stage": STAGES[0]},
        }
        text = orjson.dumps(body).decode()
        await stored.insert_profile(
            self._store, profile_id, body["created_at"], "host", hw.kind, device_kind, text
        )
        self._running = profile_id
        self._task = asyncio.create_task(self._measure(body, hw), name="host-calibration")
        return body

    async def stop(self) -> None:
        """Cancels a calibration that is measuring (its profile is stored ``failed``)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def wait(self) -> None:
        """Returns when no calibration is measuring (tests and shutdown)."""
        if self._task is not None:
            await asyncio.wait({self._task})

    async def _save(self, body: dict[str, Any]) -> None:
        await stored.update_profile(self._store, body["id"], orjson.dumps(body).decode())

    async def _measure(self, body: dict[str, Any], hw: Hardware) -> None:
        quick = bool(body["progress"]["quick"])
        try:
            for stage in STAGES:
                body["progress"]["stage"] = stage
                await self._save(body)
                result, _ = await self._runtime.call(
                    "calibration_measure", {"stage": stage, "quick": quick},
                    timeout=STAGE_TIMEOUT_S,
                )  # fmt: skip
                body["measurements"].extend(result["rows"])
                body["stack"].update(jax=result["jax"], jaxlib=result["jaxlib"])
                body["progress"]["done"].append(stage)
            body["progress"]["stage"] = None
            fitted = await anyio.to_thread.run_sync(lambda: _fit(body, hw))
            body.update(fitted, progress=body["progress"], status="done")
            await self._save(body)
            log.info("host calibration %s done: %s", body["id"], body["constants"])
        except asyncio.CancelledError:
            await self._failed(body, "shutting_down", "the service stopped while it measured")
            raise
        except ServiceError as error:
            await self._failed(body, error.code, error.detail)
        except Exception as error:  # a fault of ours: said in the profile, logged
            log.exception("host calibration %s failed", body["id"])
            await self._failed(body, "runtime_error", f"{type(error).__name__}: {error}")

    async def _failed(self, body: dict[str, Any], code: str, detail: str) -> None:
        body["status"] = "failed"
        body["problem"] = {"code": code, "detail": detail}
        try:
            await self._save(body)
        except Exception:  # the store is gone too: recover() marks it at the next start
            log.exception("could not store host calibration %s as failed", body["id"])


def _fit(body: dict[str, Any], hw: Hardware) -> dict[str, Any]:
    """The fitted profile's JSON (:func:`~datarax.estimate.host_fit.fit_host_profile`)."""
    profile = fit_host_profile(
        body["measurements"],
        hw,
        profile_id=body["id"],
        created_at=body["created_at"],
        stack=body["stack"],
        device_kind=body["device_kind"],
    )
    return dict(profile.to_json())
