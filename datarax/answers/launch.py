"""Launch configs: ``POST /v1/meshes/{id}/launch`` (DESIGN v1.2, "Launching a plan").

The answer's members are its target's, so each target has its class, all of them a
:class:`LaunchConfig` (the ``target``): :class:`MaxTextLaunch` (MaxText's command line and
environment), :class:`JobSetLaunch` (a GKE JobSet), :class:`SlurmLaunch` (an sbatch script)
and :class:`EnvLaunch` (what ``jax.distributed.initialize`` needs in each process).
:meth:`LaunchConfig.from_json` reads any of them into its target's class. The library
builds them (:func:`datarax.launch.config.launch_config`,
:func:`datarax.launch.slurm.process_env`).

Open shapes, kept as objects: a JobSet ``manifest`` is Kubernetes' own resource.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Self, cast

from datarax.answers.base import Answer, omitted

__all__ = [
    "EnvLaunch",
    "JetStreamLaunch",
    "JobSetLaunch",
    "LaunchConfig",
    "LaunchProcess",
    "MaxTextLaunch",
    "ProcessRule",
    "SlurmLaunch",
    "VllmLaunch",
]

LaunchTarget = Literal["maxtext", "jobset", "slurm", "env", "vllm", "jetstream"]


@dataclass(frozen=True, eq=False, kw_only=True)
class LaunchConfig(Answer):
    """A plan's launch config: its ``target``, and that target's members (the subclasses).
    :meth:`from_json` on this class reads the target's class."""

    target: LaunchTarget
    """maxtext: command line and flags; jobset: a GKE JobSet; slurm: an sbatch script (GPU
    plans); env: what jax.distributed.initialize needs per process; vllm: the vllm serve
    command line (serving plans); jetstream: MaxText's serving configuration (serving
    plans on TPU)"""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        """The config of a JSON object; on :class:`LaunchConfig` itself, as its
        ``target``'s class."""
        if cls is LaunchConfig and isinstance(data, Mapping):
            kind = _BY_TARGET.get(data.get("target"))  # type: ignore[arg-type]
            if kind is not None:
                return cast(Self, kind.from_json(data))
        return super().from_json(data)


@dataclass(frozen=True, eq=False, kw_only=True)
class MaxTextLaunch(LaunchConfig):
    """``target: maxtext``: MaxText's command line and the environment it runs with."""

    target: Literal["maxtext"]
    args: list[str]
    """MaxText's ``key=value`` arguments: every mesh axis' ``ici_*``/``dcn_*`` parallelism,
    ``num_slices``, the model's keys; then the request's ``extra_args``"""
    env: dict[str, str]
    """``LIBTPU_INIT_ARGS`` (TPU) or ``XLA_FLAGS`` (GPU), ``DATARAX_PLAN_ID``,
    ``DATARAX_URL``; then the request's ``extra_env``"""
    env_sources: dict[str, str]
    """where each generated variable's flags come from (a script's URL)"""
    command: list[str]
    """the command that runs the trainer with ``args``"""
    notes: list[str]
    warnings: list[str]
    """what will not run as it comes out"""


@dataclass(frozen=True, eq=False, kw_only=True)
class JobSetLaunch(LaunchConfig):
    """``target: jobset``: a ``jobset.x-k8s.io/v1alpha2`` JobSet for GKE running MaxText (a
    serving plan's: vLLM or MaxText's JetStream server)."""

    target: Literal["jobset"]
    manifest: dict[str, Any]
    """the JobSet, as Kubernetes takes it (``Accept: application/yaml`` answers it alone,
    as YAML)"""
    notes: list[str]
    warnings: list[str]
    """what will not run as it comes out: without an image the JobSet runs the placeholder
    ``maxtext:latest``"""


@dataclass(frozen=True, eq=False, kw_only=True)
class SlurmLaunch(LaunchConfig):
    """``target: slurm``: an sbatch script (GPU plans)."""

    target: Literal["slurm"]
    script: str
    """the sbatch script"""
    notes: list[str]
    warnings: list[str]
    """what will not run as it comes out: without an image the script runs the placeholder
    ``maxtext:latest``"""


@dataclass(frozen=True, eq=False)
class ProcessRule(Answer):
    """Each process's ``jax.distributed.initialize`` values as formulas over ranges (TPU:
    ``slice`` and ``worker``; GPU: ``host``)."""

    process_id: str
    """the process id as a formula, e.g. ``slice * 64 + worker``"""
    ranges: dict[str, list[int]]
    """each variable's ``[first, last]``"""
    hostname: str
    """the process's hostname, with the variables in braces"""
    local_device_ids: list[int] | None
    """null on TPU: JAX takes all of the VM's chips"""
    num_processes: int
    coordinator_address: str


@dataclass(frozen=True, eq=False, kw_only=True)
class LaunchProcess(Answer):
    """One process and what ``jax.distributed.initialize`` takes in it."""

    process_id: int
    num_processes: int
    coordinator_address: str
    local_device_ids: list[int] | None
    """null on TPU: JAX takes all of the VM's chips"""
    slice: int | None = omitted()
    """TPU: the slice of the process's VM"""
    worker: int | None = omitted()
    """TPU: the VM's worker index in its slice"""
    host: int | None = omitted()
    """GPU: the host"""
    hostname: str


@dataclass(frozen=True, eq=False, kw_only=True)
class EnvLaunch(LaunchConfig):
    """``target: env``: what ``jax.distributed.initialize`` needs in each process, listed in
    ``processes`` up to ``process_list_limit`` processes, else given by ``rule``."""

    target: Literal["env"]
    process_model: str
    """how processes map to devices, e.g. one process per TPU VM, all of its chips"""
    num_processes: int
    coordinator_address: str
    rule: ProcessRule
    """the same values as formulas over ranges (always given)"""
    processes: list[LaunchProcess] | None
    """one entry per process; null above ``process_list_limit`` processes"""
    process_list_limit: int
    env: dict[str, str] | None = omitted()
    """variables for every process (``DATARAX_PLAN_ID``, ``DATARAX_URL``, the request's
    ``extra_env``), where there are any"""
    notes: list[str]
    warnings: list[str]
    """what will not run as it comes out"""


@dataclass(frozen=True, eq=False, kw_only=True)
class VllmLaunch(LaunchConfig):
    """``target: vllm`` (serving plans): the ``vllm serve`` command line and its
    environment (:func:`datarax.launch.serving.vllm_args`)."""

    target: Literal["vllm"]
    model: str
    """the Hugging Face repository id ``vllm serve`` loads"""
    model_source: str
    """the model's card"""
    args: list[str]
    """vllm serve's flags (``--tensor-parallel-size`` ... ``--quantization``), then the
    request's ``extra_args`` as ``--key value``"""
    command: list[str]
    """``vllm serve <model>`` with ``args``"""
    env: dict[str, str]
    """``DATARAX_PLAN_ID``, ``DATARAX_URL``; then the request's ``extra_env``"""
    servers: int
    """how many servers run the command: one a host, or one a replica over Ray"""
    hosts_per_server: int
    flag_source: str
    """vLLM's argument parser the flags are checked against (a commit's URL)"""
    notes: list[str]
    warnings: list[str]
    """what will not run as it comes out"""


@dataclass(frozen=True, eq=False, kw_only=True)
class JetStreamLaunch(LaunchConfig):
    """``target: jetstream`` (serving plans on TPU): MaxText's serving configuration for its
    JetStream server (:func:`datarax.launch.serving.jetstream_args`)."""

    target: Literal["jetstream"]
    args: list[str]
    """MaxText's ``key=value``: the mesh, the model, ``per_device_batch_size``,
    ``max_prefill_predict_length``, ``max_target_length``, ``quantization``,
    ``quantize_kvcache``; then the request's ``extra_args``"""
    command: list[str]
    """MaxText's ``maxengine_server`` with ``args``"""
    env: dict[str, str]
    notes: list[str]
    warnings: list[str]
    """what will not run as it comes out"""


_BY_TARGET: dict[str, type[LaunchConfig]] = {
    "maxtext": MaxTextLaunch,
    "jobset": JobSetLaunch,
    "slurm": SlurmLaunch,
    "env": EnvLaunch,
    "vllm": VllmLaunch,
    "jetstream": JetStreamLaunch,
}
