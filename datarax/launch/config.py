"""From a plan to a running job: launch configs for a stored hardware plan (DESIGN v1.2,
"Launching a plan").

One entry point, :func:`launch_config`, for the four targets:

- ``maxtext``: MaxText's command-line ``args`` (every mesh axis' ``ici_*``/``dcn_*``
  parallelism, ``num_slices``, the model's keys) and ``env`` (``LIBTPU_INIT_ARGS`` on TPU,
  ``XLA_FLAGS`` on GPU, each set with its source): :mod:`.launch_maxtext`;
- ``jobset``: a ``jobset.x-k8s.io/v1alpha2`` JobSet for GKE running MaxText with those
  args: :mod:`.launch_k8s`;
- ``slurm``: an sbatch script (GPU plans): :mod:`.launch_slurm`;
- ``env``: what ``jax.distributed.initialize`` needs in each process: :mod:`.launch_slurm`.

Plain functions over the plan's JSON (as ``POST /v1/meshes`` answers it); nothing here
touches a device, so the service answers them in its HTTP process.

Example:
  >>> config = launch_config(plan, "maxtext")  # doctest: +SKIP
  >>> [a for a in config["args"] if a.startswith("ici_fsdp")]  # doctest: +SKIP
  ['ici_fsdp_parallelism=16']
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from datarax.answers.launch import JobSetLaunch, LaunchConfig, MaxTextLaunch, SlurmLaunch
from datarax.errors import PlanError
from datarax.hardware.chips import get_hardware
from datarax.json_types import JSONObject
from datarax.launch.maxtext_checks import check_maxtext_launch

__all__ = ["DEFAULT_IMAGE", "LAUNCH_TARGETS", "launch_config", "plan_summary"]

LAUNCH_TARGETS: tuple[str, ...] = ("maxtext", "jobset", "slurm", "env")

DEFAULT_IMAGE = "maxtext:latest"
"""The container image when a request names none: a MaxText image the user builds
(MaxText's ``docker_build_dependency_image.sh`` tags its image ``maxtext_base_image``);
the answer's ``warnings`` say to set ``image``."""

_SUMMARY_KEYS = (
    "id",
    "name",
    "hardware",
    "topology",
    "slices",
    "hosts",
    "ici",
    "dcn",
    "axes",
    "total_devices",
    "batch",
    "model",
    "optimizer",
    "allow_split_physical_axes",
    "step_estimate",  # its pipeline: MaxText's microbatches and layers per stage
    "context_parallel",
    "shard_over_data",
)


def plan_summary(plan: Mapping[str, Any]) -> JSONObject:
    """The members of a stored plan that launch configs read (no shards, no grids)."""
    return {key: plan[key] for key in _SUMMARY_KEYS if key in plan}


def _unavailable(reason: str) -> PlanError:
    return PlanError("launch_target_unavailable", reason)


def _with_extra_args(generated: Sequence[str], extra: Sequence[str], notes: list[str]) -> list[str]:
    """``generated`` then ``extra``; a generated ``key=value`` whose key an extra one names
    is dropped (MaxText would read both), and ``notes`` says which."""
    for arg in extra:
        if "=" not in arg or not arg.split("=", 1)[0]:
            raise PlanError("invalid_request", f"extra_args entry {arg!r} is not key=value")
    keys = {arg.split("=", 1)[0] for arg in extra}
    kept = []
    for arg in generated:
        key = arg.split("=", 1)[0]
        if key in keys:
            notes.append(f"extra_args replaces the generated {arg}")
        else:
            kept.append(arg)
    return kept + list(extra)


def _devices(plan: Mapping[str, Any]) -> int:
    """The plan's devices, every slice or host (a summary without ``total_devices``:
    the product of its ``axes``)."""
    if plan.get("total_devices"):
        return int(plan["total_devices"])
    return math.prod(int(v) for v in (plan.get("axes") or {}).values())


def _service_env(plan: Mapping[str, Any], service_url: str | None) -> dict[str, str]:
    """``DATARAX_PLAN_ID`` (a stored plan's id) and ``DATARAX_URL`` (when given)."""
    out = {}
    if plan.get("id"):
        out["DATARAX_PLAN_ID"] = str(plan["id"])
    if service_url:
        out["DATARAX_URL"] = service_url.rstrip("/")
    return out


def launch_config(
    plan: Mapping[str, Any],
    target: str,
    *,
    image: str | None = None,
    command: Sequence[str] | None = None,
    name: str | None = None,
    queue: str | None = None,
    extra_args: Sequence[str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    service_url: str | None = None,
) -> LaunchConfig:
    """The launch config of ``plan`` for ``target``.

    Args:
      plan: a stored hardware plan (``POST /v1/meshes``' answer, or its
        :func:`plan_summary`).
      target: one of :data:`LAUNCH_TARGETS`.
      image: container image (``jobset``, ``slurm``); default :data:`DEFAULT_IMAGE`.
      command: the container's command (default: MaxText's train module with ``args``).
      name: the job's name (default: the plan's name, else its id).
      queue: Kueue queue name (``jobset``: the ``kueue.x-k8s.io/queue-name`` label).
      extra_args: MaxText ``key=value`` arguments after the generated ones (the targets
        that run MaxText); one naming a generated key replaces it, and a note says so.
      extra_env: variables after the generated ones (every target; ``env``: the answer's
        ``env``, for every process); one naming a generated variable replaces it, and a
        note says so.
      service_url: the service's address as the job reaches it (``DATARAX_URL``). Every
        target carries the plan's id as ``DATARAX_PLAN_ID`` (a plan read back from the
        service has one) and, given this, ``DATARAX_URL``: the client's pusher reads both
        and links the job to its plan on its first push.

    Returns:
      The target's answer (:mod:`datarax.answers.launch`): ``maxtext``
      (:class:`~datarax.answers.launch.MaxTextLaunch`): ``args``, ``env``,
      ``env_sources``, ``command``; ``jobset`` (``JobSetLaunch``): ``manifest``;
      ``slurm`` (``SlurmLaunch``): ``script``; ``env`` (``EnvLaunch``): ``processes`` (or
      the rule for many processes). Every target: ``notes``, and ``warnings``, what will
      not run as it comes out (an image not given).

    Raises:
      PlanError: ``launch_target_unavailable`` for a target that does not apply (a plan
        without hardware; ``slurm`` on TPU; an unknown target), with the reason;
        ``not_launchable`` for arguments (``extra_args`` included) MaxText's own
        configuration checks would refuse at start
        (:func:`~datarax.launch.maxtext_checks.check_maxtext_launch`), for ``maxtext`` and
        for ``jobset``/``slurm`` running MaxText's trainer (no ``command`` given), with
        MaxText's reason and what it would accept.
    """
    if target not in LAUNCH_TARGETS:
        raise _unavailable(f"target {target!r} is not one of {list(LAUNCH_TARGETS)}")
    if not plan.get("hardware"):
        raise _unavailable(
            "the plan names no hardware, so there is nothing to launch on: plan it with "
            "hardware and ici (e.g. {'hardware': 'tpu-v5e', 'topology': '16x16', 'ici': "
            "{'fsdp': -1}})"
        )
    hw = get_hardware(plan["hardware"])
    if hw.kind == "cpu":
        raise _unavailable("cpu plans describe simulated devices; there is no job to launch")
    if target == "slurm" and hw.kind != "gpu":
        raise _unavailable(
            f"slurm scripts are for GPU clusters; {hw.name} is a TPU: use target "
            "'jobset' (GKE) or 'maxtext' (the command line and LIBTPU_INIT_ARGS)"
        )
    from datarax.launch import k8s as launch_k8s  # noqa: PLC0415
    from datarax.launch import maxtext as launch_maxtext  # noqa: PLC0415
    from datarax.launch import slurm as launch_slurm  # noqa: PLC0415

    maxtext = launch_maxtext.maxtext_args(plan)
    notes = list(maxtext.get("notes", ()))
    args = _with_extra_args(maxtext["args"], extra_args or (), notes)
    env = dict(maxtext["env"])
    env.update(_service_env(plan, service_url))
    for key, value in (extra_env or {}).items():
        if key in env and env[key] != value:
            notes.append(f"extra_env replaces the generated {key}={env[key]!r}")
        env[key] = value
    image_given = image is not None
    image = image or DEFAULT_IMAGE
    warnings: list[str] = []
    if target in ("jobset", "slurm") and not image_given:
        warnings.append(
            f"no image was given, so the {target} runs {DEFAULT_IMAGE!r}, which is not a "
            "published image: set image to your MaxText image"
        )
    if target == "maxtext" or (target in ("jobset", "slurm") and not command):
        # what runs MaxText's trainer with these args: MaxText's checks refuse it at start
        if maxtext["refusal"] is not None:
            raise PlanError("not_launchable", maxtext["refusal"])
        check_maxtext_launch(args, devices=_devices(plan))
    command = list(command) if command else launch_slurm.default_command(args)
    if target == "maxtext":
        return MaxTextLaunch(
            target="maxtext",
            args=args,
            env=env,
            env_sources=dict(maxtext.get("env_sources", {})),
            command=command,
            notes=notes,
            warnings=warnings,
        )
    if target == "jobset":
        manifest = launch_k8s.jobset_manifest(
            plan, args=args, env=env, image=image, command=command, name=name, queue=queue
        )
        return JobSetLaunch(target="jobset", manifest=manifest, notes=notes, warnings=warnings)
    if target == "slurm":
        script = launch_slurm.slurm_script(
            plan, args=args, env=env, image=image, command=command, name=name
        )
        return SlurmLaunch(target="slurm", script=script, notes=notes, warnings=warnings)
    processes = launch_slurm.process_env(plan, name=name)
    every = {**_service_env(plan, service_url), **(extra_env or {})}
    return replace(processes, env=every or None, notes=notes + processes.notes, warnings=warnings)
