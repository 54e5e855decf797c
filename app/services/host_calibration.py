"""``POST /v1/calibrations {"kind": "host"}``: the host measures itself (DESIGN v1.3,
"Calibrations").

The profile is stored at once with ``status`` ``running`` (202, ``Location``), then one
runtime command per stage of :mod:`datarax.estimate.host_calibration` measures the
live devices (``calibration_measure``, :mod:`app.runtime.calibration`); after each
stage the profile is rewritten with its ``progress`` and the rows so far, so a client
polling ``GET /v1/calibrations/{id}`` sees it move. The constants are then fitted on
the rows (:func:`~datarax.estimate.host_calibration.fit_host_profile`, in a thread) and
the profile is stored ``done``, with the JAX and jaxlib versions that measured it; or
``failed``, with the ``problem`` that stopped it. A profile left ``running`` by a process
that stopped is marked ``failed`` when the next one starts
(:meth:`HostCalibrations.recover`).

One host calibration runs at a time, across the replicas that share a database (409
``calibration_running``): the check for a running one and the insert of the new one are
one write transaction (:func:`app.storage.calibrations.start_host_profile`; serializable
on PostgreSQL, so of two replicas starting at once one finds the other's). Service-wide,
not per process: replicas sharing a database usually share a host (or its devices), where
two measurements would skew each other, and the newest host profile is the default of
every replica's plans on those devices. :meth:`HostCalibrations.stop` cancels and awaits
every measuring task this process started.

Time: the stages queue behind other runtime commands (training steps) and each may run
``STAGE_TIMEOUT_S`` at most; quick mode takes about 10 s on a two-core host with 8
simulated CPU devices (BENCHMARKS.md, "Host calibration").
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import replace
from datetime import UTC, datetime

import anyio.to_thread
import orjson

from app.core.errors import CalibrationRunning, ServiceError, from_library
from app.storage import calibrations as stored
from app.storage.store import Store
from app.workers.runtime_client import RuntimeClient
from datarax.answers.calibrations import (
    CalibrationProblem,
    CalibrationProfile,
    CalibrationProgress,
    CalibrationStack,
)
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

    def __init__(self, store: Store, runtime: RuntimeClient, keep: int | None = None) -> None:
        self._store = store
        self._runtime = runtime
        self._keep = keep  # DATARAX_CALIBRATIONS_KEEP: applied as a profile is stored
        self._tasks: dict[str, asyncio.Task[None]] = {}  # measuring, by profile id
        self._stopping = False

    async def recover(self) -> None:
        """Marks ``failed`` the profiles a stopped process left ``running``."""
        for text in await stored.running_profiles(self._store):
            profile = CalibrationProfile.from_json(orjson.loads(text))
            await self._save(
                replace(
                    profile,
                    status="failed",
                    problem=CalibrationProblem(
                        code="runtime_error",
                        detail="the service stopped while this calibration measured; run it again",
                    ),
                )
            )

    async def start(self, quick: bool, hardware: str | None) -> CalibrationProfile:
        """Stores a ``running`` profile and starts measuring; returns the profile.

        Raises:
          ServiceError: 409 ``calibration_running``; 422 ``invalid_calibration``,
            ``unknown_hardware``; the runtime's own (``worker_lost``) when it is down;
            503 ``shutting_down`` once :meth:`stop` has run.
        """
        if self._tasks:  # this process's: no need to ask the runtime first
            raise _running(next(iter(self._tasks)))
        self._check_open()
        devices, _ = await self._runtime.call("devices")
        device_kind = str(devices["devices"][0]["kind"])
        platform = str(devices["platform"])
        hw = catalog_entry(device_kind, platform, hardware)
        profile = CalibrationProfile(
            id=f"host-{uuid.uuid4().hex[:12]}",
            kind="host",
            status="running",
            created_at=_now(),
            hardware=hw.name,
            hardware_kind=hw.kind,
            device_kind=device_kind,
            stack=CalibrationStack(framework="jax", backend=platform),
            constants=None,
            measurements=(),
            error=None,
            progress=CalibrationProgress(quick=quick, stages=STAGES, done=(), stage=STAGES[0]),
        )
        self._check_open()
        text = orjson.dumps(profile.to_json()).decode()
        running = await stored.start_host_profile(
            self._store, profile.id, profile.created_at, hw.kind, device_kind, text,
            keep=self._keep,
        )  # fmt: skip
        if running is not None:
            raise _running(running)
        if self._stopping:  # stopped while the profile was stored: it ends failed
            await self._failed(profile, "shutting_down", "the service stopped as it started")
            self._check_open()  # raises
        task = asyncio.create_task(
            self._measure(profile, hw), name=f"host-calibration {profile.id}"
        )
        self._tasks[profile.id] = task
        task.add_done_callback(lambda _: self._tasks.pop(profile.id, None))
        return profile

    def _check_open(self) -> None:
        if self._stopping:
            raise ServiceError(
                "the service is shutting down: start the host calibration after the restart",
                code="shutting_down",
            )

    async def stop(self) -> None:
        """Cancels and awaits every calibration this process is measuring (each profile is
        stored ``failed``); later :meth:`start` calls answer 503 ``shutting_down``."""
        self._stopping = True
        measuring = dict(self._tasks)
        for task in measuring.values():
            task.cancel()
        await asyncio.gather(*measuring.values(), return_exceptions=True)
        for profile_id in measuring:  # a task cancelled before it ran stored no failure
            text = await stored.get_profile(self._store, profile_id)
            if text is not None and orjson.loads(text).get("status") == "running":
                profile = CalibrationProfile.from_json(orjson.loads(text))
                await self._failed(profile, "shutting_down", "the service stopped as it began")

    async def wait(self) -> None:
        """Returns when no calibration is measuring (tests and shutdown)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks.values()))

    async def _save(self, profile: CalibrationProfile) -> None:
        text = orjson.dumps(profile.to_json()).decode()
        await stored.update_profile(self._store, profile.id, text)

    async def _measure(self, profile: CalibrationProfile, hw: Hardware) -> None:
        progress = profile.progress
        assert progress is not None  # start() measures with it
        try:
            for stage in STAGES:
                progress = replace(progress, stage=stage)
                profile = replace(profile, progress=progress)
                await self._save(profile)
                result, _ = await self._runtime.call(
                    "calibration_measure", {"stage": stage, "quick": progress.quick},
                    timeout=STAGE_TIMEOUT_S,
                )  # fmt: skip
                progress = replace(progress, done=(*progress.done, stage))
                profile = replace(
                    profile,
                    measurements=(*profile.measurements, *result["rows"]),
                    stack=replace(profile.stack, jax=result["jax"], jaxlib=result["jaxlib"]),
                    progress=progress,
                )
            progress = replace(progress, stage=None)
            measured = replace(profile, progress=progress)
            fitted = await anyio.to_thread.run_sync(lambda: _fit(measured, hw))
            profile = replace(fitted, progress=progress)
            await self._save(profile)
            log.info("host calibration %s done: %s", profile.id, profile.constants)
        except asyncio.CancelledError:
            await self._failed(profile, "shutting_down", "the service stopped while it measured")
            raise
        except ServiceError as error:
            await self._failed(profile, error.code, error.detail)
        except Exception as error:  # a fault of ours: said in the profile, logged
            log.exception("host calibration %s failed", profile.id)
            await self._failed(profile, "runtime_error", f"{type(error).__name__}: {error}")

    async def _failed(self, profile: CalibrationProfile, code: str, detail: str) -> None:
        failed = replace(
            profile, status="failed", problem=CalibrationProblem(code=code, detail=detail)
        )
        try:
            await self._save(failed)
        except Exception:  # the store is gone too: recover() marks it at the next start
            log.exception("could not store host calibration %s as failed", profile.id)


def _running(profile_id: str) -> CalibrationRunning:
    return CalibrationRunning(
        f"host calibration {profile_id!r} is measuring the devices; "
        f"GET /v1/calibrations/{profile_id} shows its progress"
    )


def _fit(profile: CalibrationProfile, hw: Hardware) -> CalibrationProfile:
    """The fitted profile (:func:`~datarax.estimate.host_fit.fit_host_profile`)."""
    return fit_host_profile(
        profile.measurements,
        hw,
        profile_id=profile.id,
        created_at=profile.created_at,
        stack=profile.stack,
        device_kind=profile.device_kind,
    )
