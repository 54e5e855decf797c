"""Serving calibration profiles (DESIGN v1.4: a ``stack.framework`` per serving engine):
the constants that price prefill and decode, one profile per accelerator kind and engine,
``published-<kind>-<engine>``.

They are the training profiles' constants (:class:`~datarax.answers.calibrations.
CalibrationConstants`, one definition) read for serving by
:func:`datarax.estimate.serving.estimate_serving`:

- ``matmul`` and ``attention``: the fractions of peak a prefill's projections and its
  attention kernel reach (``grouped_matmul``: the routed experts');
- ``hbm``: the fraction of HBM bandwidth a decode step's weight and KV cache reads reach;
- ``overlap``: the share of the shorter of a pass's compute and HBM time that hides
  behind the longer (1: a roofline's max; 0: their sum);
- ``overhead_s``: fixed time of each engine step (scheduling, sampling, launch);
- ``layer_s``: fixed time of each layer a device runs in a step (its kernels'
  launches);
- ``link`` and ``collective_s``: as in training, for the tensor-parallel all-reduces,
  the experts' all-to-all and the stages' sends.

The shipped figures are fitted by ``benchmarks/serving_calibration.py`` on the published
serving runs that issue 57 names (MLPerf Inference v4.0 ``closed/NVIDIA`` Llama 2 70B;
``AI-Hypercomputer/jetstream-pytorch`` on a TPU v5e-8); BENCHMARKS.md has the rows, the
fit and the held-out error. Plain data.

Example:
  >>> from datarax.hardware.chips import get_hardware
  >>> serving_profile(get_hardware("tpu-v5e"), "jetstream").id
  'published-tpu-jetstream'
"""

from __future__ import annotations

from dataclasses import replace

from datarax.answers.calibrations import (
    CalibrationConstants,
    CalibrationProfile,
    CalibrationStack,
    PublishedFitError,
)
from datarax.errors import PlanError
from datarax.hardware.entry import Hardware

__all__ = [
    "SERVING_CONSTANTS",
    "SERVING_ERRORS",
    "is_serving_profile",
    "serving_profile",
    "serving_profiles",
]

_PUBLISHED_AT = "2026-12-06T00:00:00Z"
_FIT = "fitted by benchmarks/serving_calibration.py on "
_MLPERF = "MLPerf Inference v4.0 closed/NVIDIA Llama 2 70B (TensorRT-LLM, H100 and H200)"
_JETSTREAM = "jetstream-pytorch benchmarks/summary.md (TPU v5e-8)"

_TRT = CalibrationConstants(0.6, 0.48, 0.6, 0.0, 0.005, _FIT + _MLPERF)
_JET = CalibrationConstants(0.35, 0.28, 0.6, 0.0, 0.005, _FIT + _JETSTREAM)
_NO_VLLM_ROWS = " (the named sources publish no vLLM runs: this engine's fit is reused)"

SERVING_CONSTANTS: dict[str, CalibrationConstants] = {
    "published-gpu-tensorrt-llm": _TRT,
    "published-gpu-vllm": replace(_TRT, source=_TRT.source + _NO_VLLM_ROWS),
    "published-tpu-jetstream": _JET,
    "published-tpu-vllm": replace(_JET, source=_JET.source + _NO_VLLM_ROWS),
    "published-cpu-vllm": CalibrationConstants(
        1.0, 1.0, 1.0, 1.0, 0.0, "nominal: simulated devices"
    ),
}
"""The serving constants by profile (module docstring): ``matmul, attention, hbm,
overlap, overhead_s``. Both fits sum a pass's compute and HBM time (overlap 0), with
5 ms a step and 60% of HBM bandwidth (the edges of the grid the fit searches: its rows
are all large batches, which cannot tell the two apart); the matmuls reach 60% of the
FP8 peak on GPUs (TensorRT-LLM) and 35% of peak on TPUs (JetStream)."""

SERVING_ERRORS: dict[str, dict[str, float | int | None]] = {
    "published-gpu-tensorrt-llm": {
        "training_mae": 0.051, "training_runs": 4, "held_out_mae": 0.144, "held_out_runs": 2,
    },
    "published-tpu-jetstream": {
        "training_mae": 0.174, "training_runs": 5, "held_out_mae": 0.097, "held_out_runs": 2,
    },
}  # fmt: skip
"""How each fitted serving profile fits its rows (``training_mae``, ``training_runs``,
``held_out_mae``, ``held_out_runs``: output tokens per second)."""

_ENGINE_FRAMEWORK = {"vllm": "vllm", "jetstream": "jetstream", "tensorrt-llm": "tensorrt-llm"}


def _profile(profile_id: str, constants: CalibrationConstants) -> CalibrationProfile:
    _, kind, framework = profile_id.split("-", 2)
    error = SERVING_ERRORS.get(profile_id)
    return CalibrationProfile(
        id=profile_id,
        kind="published",
        created_at=_PUBLISHED_AT,
        hardware_kind=kind,
        stack=CalibrationStack(
            framework=framework, backend={"tpu": "tpu", "gpu": "cuda", "cpu": "cpu"}[kind]
        ),
        constants=constants,
        error=None if error is None else PublishedFitError.from_json(error),
    )


_PROFILES = {pid: _profile(pid, c) for pid, c in SERVING_CONSTANTS.items()}


def serving_profiles() -> list[CalibrationProfile]:
    """The shipped serving profiles, by id."""
    return [_PROFILES[pid] for pid in sorted(_PROFILES)]


def is_serving_profile(profile_id: str) -> bool:
    return profile_id in _PROFILES


def serving_profile(
    hw: Hardware, engine: str, calibration: str | CalibrationProfile | None = None
) -> CalibrationProfile:
    """The profile pricing ``engine`` on ``hw``: ``calibration`` where given (a serving
    profile id, or a profile the caller resolved), else ``published-<kind>-<engine>``,
    else the kind's vLLM profile (TensorRT-LLM runs on GPUs only; JetStream on TPUs).

    Raises:
      PlanError: ``unknown_calibration`` for an id that is no serving profile;
        ``invalid_calibration`` for a profile of another accelerator kind, or an engine
        that does not run on ``hw`` (JetStream off TPU, TensorRT-LLM off GPU).
    """
    if engine == "jetstream" and hw.kind == "gpu" or engine == "tensorrt-llm" and hw.kind == "tpu":
        runs_on = "TPUs" if engine == "jetstream" else "NVIDIA GPUs"
        raise PlanError(
            "invalid_serving",
            f"engine {engine!r} runs on {runs_on} and {hw.name} is a {hw.kind}: use vllm, "
            f"which runs on both",
        )
    if calibration is None:
        framework = _ENGINE_FRAMEWORK[engine]
        pid = f"published-{hw.kind}-{framework}"
        return _PROFILES.get(pid) or _PROFILES[f"published-{hw.kind}-vllm"]
    if isinstance(calibration, CalibrationProfile):
        profile = calibration
    elif calibration in _PROFILES:
        profile = _PROFILES[calibration]
    else:
        raise PlanError(
            "unknown_calibration",
            f"calibration {calibration!r} is no serving profile; the serving profiles are "
            f"{sorted(_PROFILES)}",
        )
    if profile.hardware_kind != hw.kind:
        same = [p for p in sorted(_PROFILES) if _PROFILES[p].hardware_kind == hw.kind]
        raise PlanError(
            "invalid_calibration",
            f"calibration {profile.id!r} is for {profile.hardware_kind} hardware and "
            f"{hw.name} is {hw.kind}; use one of {same}",
        )
    return profile
