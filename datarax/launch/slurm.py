"""Processes of a launched plan: who runs where, what ``jax.distributed.initialize`` needs in
each process (:func:`process_env`), and the sbatch script of a GPU plan
(:func:`slurm_script`).

The process model, the same for every launcher here:

- TPU: one JAX process per TPU VM (a plan's ``hosts``), each owning its VM's chips; JAX
  never narrows ``local_device_ids`` on TPU (``jax/_src/clusters/cluster.py``).
- GPU: one JAX process per host, each owning all of its host's GPUs (the JobSet's one pod
  per host with ``nvidia.com/gpu`` = GPUs per host, and MaxText's GPU launcher, which
  reads ``NNODES`` / ``NODE_RANK``: ``MaxText/max_utils.py::initialize_jax_for_gpu``).

  On SLURM this is not JAX's default: ``jax._src.clusters.slurm_cluster`` (jax 0.12)
  takes ``SLURM_NTASKS`` processes and, unless ``local_device_ids`` is given, restricts
  each to the one GPU ``[SLURM_LOCALID]`` (one process per GPU). A script that ran one
  task per node without more would leave 7 of 8 GPUs idle. So the script runs
  ``--ntasks-per-node=1`` and exports ``JAX_LOCAL_DEVICE_IDS=0,...,G-1``, which
  ``jax.distributed.initialize`` reads before its cluster detection
  (``jax/_src/distributed.py``) and which stops the detection from narrowing it.

Process ids: TPU ``slice * hosts_per_slice + worker`` (``worker`` = ``TPU_WORKER_ID``, the
pod's completion index in its slice's Job; JAX's ``BaseTpuCluster.get_process_id``);
GPU the host's rank (the JobSet pod's completion index; SLURM's ``SLURM_PROCID``).

Names of pods follow JobSet v0.12.0 (kubernetes-sigs/jobset ``f22e565``,
``api/jobset/v1alpha2/jobset_types.go``): pod ``<jobset>-<replicatedJob>-<jobIndex>-
<podIndex>``, reachable as ``<pod>.<jobset>`` through the JobSet's headless service.
:mod:`datarax.launch.k8s` builds the manifest from the same constants.

Example:
  >>> env = process_env(plan)  # doctest: +SKIP
  >>> env["num_processes"], env["processes"][1]["process_id"]  # doctest: +SKIP
  (4, 1)
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from datarax.answers.launch import EnvLaunch, LaunchProcess, ProcessRule
from datarax.errors import PlanError
from datarax.hardware.chips import get_hardware

__all__ = [
    "COORDINATOR_PORTS",
    "PROCESS_LIST_LIMIT",
    "REPLICATED_JOB_NAMES",
    "ProcessLayout",
    "check_env",
    "default_command",
    "job_name",
    "process_env",
    "process_layout",
    "slurm_script",
]

PROCESS_LIST_LIMIT = 64
""":func:`process_env` lists each process up to this many; above, it answers the rule only
(a 16,384-host plan would otherwise answer 16,384 near-identical entries)."""

REPLICATED_JOB_NAMES: Mapping[str, str] = {"tpu": "slice", "gpu": "host"}
"""The JobSet's replicated job per device kind: one Job per TPU slice; one Job of all hosts
on GPU."""

COORDINATOR_PORTS: Mapping[str, int] = {"tpu": 8482, "gpu": 6002}
"""Port of JAX's coordinator (process 0). TPU: ``coordinator_port`` of
``jax/_src/clusters/cloud_tpu_cluster.py`` (jax 0.12), which the TPU detection appends to
``MEGASCALE_COORDINATOR_ADDRESS``; GPU: xpk's ``JAX_COORDINATOR_PORT`` (6002,
``src/xpk/core/docker_resources.py::get_gpu_env``, AI-Hypercomputer/xpk ``367c838``)."""

_MAX_LABEL = 63
# JobSet's webhook (v0.12.0, pkg/webhooks/jobset_webhook.go) checks the longest pod name
# plus a 5-character random suffix is a DNS-1035 label.
_POD_SUFFIX = "-abcde"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _unavailable(reason: str) -> PlanError:
    return PlanError("launch_target_unavailable", reason)


@dataclass(frozen=True)
class ProcessLayout:
    """A plan's processes.

    Attributes:
      kind: ``"tpu"`` or ``"gpu"``.
      hardware: catalog name (``"tpu-v5e"``).
      slices: TPU slices; on GPU the NVLink domains (informational: one Job holds all hosts).
      hosts: hosts (TPU VMs / GPU nodes) in all, one JAX process each.
      hosts_per_slice: TPU VMs per slice (TPU); ``hosts`` on GPU (one Job of all hosts).
      devices_per_host: chips per TPU VM / GPUs per node.
      topology: TPU slice shape without the generation (``"16x16"``); ``None`` on GPU.
    """

    kind: str
    hardware: str
    slices: int
    hosts: int
    hosts_per_slice: int
    devices_per_host: int
    topology: str | None

    @property
    def replicas(self) -> int:
        """Jobs of the JobSet's replicated job: TPU slices; 1 on GPU."""
        return self.slices if self.kind == "tpu" else 1

    @property
    def pods_per_job(self) -> int:
        """Pods of each Job (its ``parallelism`` and ``completions``)."""
        return self.hosts_per_slice

    @property
    def replicated_job(self) -> str:
        """The JobSet's replicated job name."""
        return REPLICATED_JOB_NAMES[self.kind]


def _positive_int(plan: Mapping[str, Any], key: str) -> int:
    value = plan.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _unavailable(
            f"the plan's {key!r} is {value!r}, not a positive integer: launch a stored "
            "hardware plan as POST /v1/meshes answers it"
        )
    return value


SINGLE_HOST_CHIPS = {"tpu-v5e": 8, "tpu-v6e": 8}
"""The most chips a TPU slice has that is one VM: v5e and v6e slices of up to 8 chips (1x1,
2x2, 2x4) run on single-host machine types (ct5lp-hightpu-1t/4t/8t, ct6e-standard-1t/4t/
8t), larger ones on 4-chip VMs (Google Cloud, "Plan TPUs in GKE",
https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus, and the TPU v6e page,
https://cloud.google.com/tpu/docs/v6e: 8 chips per host). v4, v5p and TPU7x VMs hold 4
chips at every size (ct4p-hightpu-4t, ct5p-hightpu-4t, tpu7x-standard-4t), which is the
catalog's ``devices_per_host`` (TPU7x: 8 devices, two a chip). JAX's topology describes a
v5e/v6e 2x4 as two processes of 2x2 chips (what a plan's ``hosts`` says); the launch
configs follow the machine type."""


def process_layout(plan: Mapping[str, Any]) -> ProcessLayout:
    """The processes of ``plan`` (a stored hardware plan, or its summary).

    Raises:
      PlanError: ``launch_target_unavailable`` for a plan without TPU or GPU hardware, or
        whose ``hosts`` / ``slices`` / ``total_devices`` disagree.
    """
    name = plan.get("hardware")
    if not name:
        raise _unavailable(
            "the plan names no hardware, so there is nothing to launch on: plan it with "
            "'hardware' (e.g. 'tpu-v5e' and a 'topology')"
        )
    hw = get_hardware(name)
    if hw.kind not in ("tpu", "gpu"):
        raise _unavailable(f"{hw.name} plans describe simulated devices; there is no job to run")
    slices, hosts = _positive_int(plan, "slices"), _positive_int(plan, "hosts")
    total = _positive_int(plan, "total_devices")
    if total % hosts:
        raise _unavailable(f"the plan's total_devices {total} do not split over {hosts} hosts")
    per_host = total // hosts
    topology = None
    if hw.kind == "tpu":
        topology = str(plan.get("topology") or "").split(":")[-1]
        if not topology or hosts % slices:
            raise _unavailable(
                f"TPU plan with topology {plan.get('topology')!r}, {slices} slices and "
                f"{hosts} hosts: want a slice shape and hosts divisible by slices"
            )
        # One VM of a 1x1 slice has one chip (ct5lp-hightpu-1t); otherwise 4 (the catalog).
        chip_count = math.prod(map(int, topology.split("x")))
        if per_host > hw.devices_per_host or chip_count * hw.devices_per_chip != total // slices:
            raise _unavailable(
                f"TPU plan: {total} chips on {hosts} hosts in {slices} slices of "
                f"{topology} do not match {hw.name}'s {hw.devices_per_host} chips per VM"
            )
        hosts_per_slice = hosts // slices
        if chip_count <= SINGLE_HOST_CHIPS.get(hw.name, 0) and hosts_per_slice > 1:
            # a single-host machine type holds the whole slice: one VM, all its chips
            hosts, hosts_per_slice, per_host = slices, 1, total // slices
    else:
        if per_host != hw.devices_per_host:
            raise _unavailable(
                f"GPU plan: {total} GPUs on {hosts} hosts is not {hw.devices_per_host} per "
                f"host as {hw.name} has"
            )
        hosts_per_slice = hosts
    return ProcessLayout(
        kind=hw.kind,
        hardware=hw.name,
        slices=slices,
        hosts=hosts,
        hosts_per_slice=hosts_per_slice,
        devices_per_host=per_host,
        topology=topology,
    )


def job_name(plan: Mapping[str, Any], name: str | None = None) -> str:
    """A DNS-1035 label for the job: ``name``, else the plan's name, else its id, sanitised.

    Lower-cased; runs of other characters than ``[a-z0-9]`` become one ``-``; a leading
    digit gets a ``j`` in front; cut short so that JobSet's longest pod name
    ``<name>-<replicatedJob>-<lastJob>-<lastPod>-abcde`` stays within 63 characters
    (JobSet v0.12.0 ``pkg/webhooks/jobset_webhook.go`` refuses a JobSet otherwise).
    The same name serves the SLURM job and the JobSet.

    Raises:
      PlanError: ``launch_target_unavailable`` as :func:`process_layout`.
    """
    layout = process_layout(plan)
    raw = name if name else (plan.get("name") or plan.get("id") or "datarax")
    label = re.sub(r"[^a-z0-9]+", "-", str(raw).lower()).strip("-")
    if not label:
        label = "datarax"
    if not label[0].isalpha():
        label = f"j{label}"
    tail = f"-{layout.replicated_job}-{layout.replicas - 1}-{layout.pods_per_job - 1}"
    budget = _MAX_LABEL - len(tail) - len(_POD_SUFFIX)
    return label[:budget].rstrip("-")


def default_command(args: Sequence[str]) -> list[str]:
    """MaxText's trainer with ``args``, run from a MaxText checkout's root as its README
    does since the ``src/maxtext`` layout (the commit ``launch_maxtext.MAXTEXT_COMMIT``
    takes its keys from): ``python3 -m maxtext.trainers.pre_train.train
    src/maxtext/configs/base.yml key=value ...``."""
    return [
        "python3",
        "-m",
        "maxtext.trainers.pre_train.train",
        "src/maxtext/configs/base.yml",
        *args,
    ]


def check_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` as a plain dict, each name a shell identifier and each value a string.

    Raises:
      ValueError: naming the first bad entry.
    """
    out: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise ValueError(f"env name {key!r} is not an identifier ([A-Za-z_][A-Za-z0-9_]*)")
        if not isinstance(value, str):
            raise ValueError(f"env {key}={value!r}: values are strings; quote it")
        out[key] = value
    return out


# ------------------------------------------------------------------------- per process


def _hostname(name: str, layout: ProcessLayout, job: int | str, pod: int | str) -> str:
    return f"{name}-{layout.replicated_job}-{job}-{pod}.{name}"


def process_env(plan: Mapping[str, Any], *, name: str | None = None) -> EnvLaunch:
    """What ``jax.distributed.initialize`` needs in each process of ``plan``.

    Hostnames are those of the plan's JobSet (:func:`datarax.launch.k8s.
    jobset_manifest` with the same ``name``); on SLURM the coordinator is the first node
    of the allocation instead (``slurm_script`` exports it), the rest is the same.

    Args:
      plan: a stored hardware plan (``POST /v1/meshes``' answer) or its summary.
      name: the job's name (default: the plan's name, else its id; sanitised by
        :func:`job_name`).

    Returns:
      The ``env`` target's answer (:class:`~datarax.answers.launch.EnvLaunch`, without
      ``env`` and ``warnings``): ``process_model``, ``num_processes``,
      ``coordinator_address``, ``rule``, ``processes``, ``process_list_limit`` and
      ``notes``. ``processes``: one entry per process
      (``process_id``, ``coordinator_address``, ``num_processes``, ``local_device_ids``
      (``None`` on TPU: JAX takes all of the VM's chips), ``hostname``, ``slice`` and
      ``worker`` on TPU, ``host`` on GPU) when there are at most
      :data:`PROCESS_LIST_LIMIT`, else ``None``; ``rule``: the same as a formula over the
      ranges (always given), e.g. TPU ``{"process_id": "slice * 64 + worker", "ranges":
      {"slice": [0, 255], "worker": [0, 63]}, "hostname": "...-{slice}-{worker}..."}``.

    Raises:
      PlanError: ``launch_target_unavailable`` as :func:`process_layout`.
    """
    layout = process_layout(plan)
    label = job_name(plan, name)
    port = COORDINATOR_PORTS[layout.kind]
    coordinator = f"{_hostname(label, layout, 0, 0)}:{port}"
    n = layout.hosts
    if layout.kind == "tpu":
        local_ids: list[int] | None = None
        rule = ProcessRule(
            process_id=f"slice * {layout.hosts_per_slice} + worker",
            ranges={"slice": [0, layout.slices - 1], "worker": [0, layout.hosts_per_slice - 1]},
            hostname=_hostname(label, layout, "{slice}", "{worker}"),
            local_device_ids=None,
            num_processes=n,
            coordinator_address=coordinator,
        )
        model = "one process per TPU VM, all of its chips"
        notes = [
            "TPU: jax.distributed.initialize() with no arguments finds these on GKE: "
            "TPU_WORKER_ID and TPU_WORKER_HOSTNAMES (GKE's TPU webhook) and, for multislice, "
            "MEGASCALE_COORDINATOR_ADDRESS / MEGASCALE_NUM_SLICES / MEGASCALE_SLICE_ID (the "
            "JobSet's env); jax/_src/clusters/cloud_tpu_cluster.py",
        ]
    else:
        local_ids = list(range(layout.devices_per_host))
        rule = ProcessRule(
            process_id="host",
            ranges={"host": [0, n - 1]},
            hostname=_hostname(label, layout, 0, "{host}"),
            local_device_ids=local_ids,
            num_processes=n,
            coordinator_address=coordinator,
        )
        model = "one process per host, all of its GPUs"
        notes = [
            "GPU: one process per host (JAX's SLURM default is one per GPU; the SLURM "
            "script exports JAX_LOCAL_DEVICE_IDS so that each process keeps every GPU of "
            "its node)",
            f"on SLURM the coordinator is the allocation's first node instead, port {port} "
            "(the script's JAX_COORDINATOR_ADDRESS); ids and counts are the same",
        ]
    processes: list[LaunchProcess] | None = None
    if n <= PROCESS_LIST_LIMIT:
        processes = []
        for pid in range(n):
            if layout.kind == "tpu":
                slice_id, worker = divmod(pid, layout.hosts_per_slice)
                process = LaunchProcess(
                    process_id=pid,
                    num_processes=n,
                    coordinator_address=coordinator,
                    local_device_ids=local_ids,
                    slice=slice_id,
                    worker=worker,
                    hostname=_hostname(label, layout, slice_id, worker),
                )
            else:
                process = LaunchProcess(
                    process_id=pid,
                    num_processes=n,
                    coordinator_address=coordinator,
                    local_device_ids=local_ids,
                    host=pid,
                    hostname=_hostname(label, layout, 0, pid),
                )
            processes.append(process)
    else:
        notes.append(
            f"{n} processes: more than {PROCESS_LIST_LIMIT}, so 'processes' is null and "
            "'rule' gives each process's values"
        )
    return EnvLaunch(
        target="env",
        process_model=model,
        num_processes=n,
        coordinator_address=coordinator,
        rule=rule,
        processes=processes,
        process_list_limit=PROCESS_LIST_LIMIT,
        notes=notes,
        warnings=[],
    )


# ------------------------------------------------------------------------------- SLURM


def slurm_script(
    plan: Mapping[str, Any],
    *,
    args: Sequence[str],
    env: Mapping[str, str],
    image: str | None = None,
    command: Sequence[str] | None = None,
    name: str | None = None,
) -> str:
    """An sbatch script running ``command`` on every host of a GPU plan.

    One task per node with all its GPUs (the module docstring says why): ``#SBATCH
    --nodes`` = hosts, ``--ntasks-per-node=1``, ``--gpus-per-node`` = GPUs per host. The
    script exports ``env`` and what the trainer's ``jax.distributed.initialize`` reads:
    ``JAX_LOCAL_DEVICE_IDS`` (all GPUs; JAX's SLURM detection, ``jax._src.clusters.
    slurm_cluster``, then takes ``SLURM_NTASKS`` processes, ``SLURM_PROCID`` as the id and
    the first node of ``SLURM_STEP_NODELIST`` as the coordinator); ``JAX_COORDINATOR_IP``
    / ``JAX_COORDINATOR_PORT`` / ``NNODES`` and per task ``NODE_RANK`` for MaxText's
    ``hardware=gpu`` launcher (``MaxText/max_utils.py::initialize_jax_for_gpu``), plus
    ``JAX_COORDINATOR_ADDRESS`` (the same ``host:port``, which JAX reads itself),
    ``JAX_NUM_PROCESSES`` and per task ``JAX_PROCESS_ID``.

    With ``image``, ``srun`` runs in that container through NVIDIA's pyxis plugin
    (``--container-image``); without, on the nodes' own Python.

    Args:
      plan: a stored GPU hardware plan (``POST /v1/meshes``' answer) or its summary.
      args: MaxText's ``key=value`` arguments (the default command's tail).
      env: variables to export (``XLA_FLAGS``, ...); names must be identifiers.
      image: container image for pyxis, or ``None``.
      command: the program and its arguments (default :func:`default_command`).
      name: the job name (default: the plan's name or id; sanitised by :func:`job_name`).

    Returns:
      The script's text (bash; ``bash -n`` and ``shellcheck`` clean).

    Raises:
      PlanError: ``launch_target_unavailable`` for a TPU plan (GKE runs those: target
        ``jobset``) and as :func:`process_layout`.
      ValueError: an env name that is not an identifier or a non-string value.
    """
    layout = process_layout(plan)
    if layout.kind != "gpu":
        raise _unavailable(
            f"slurm scripts are for GPU clusters; {layout.hardware} is a TPU: use target "
            "'jobset' (GKE) or 'maxtext' (the command line and LIBTPU_INIT_ARGS)"
        )
    exported = check_env(env)
    label = job_name(plan, name)
    argv = list(command) if command else default_command(args)
    if not argv:
        raise ValueError("command is empty; give the program and its arguments")
    gpus = layout.devices_per_host
    plan_id = re.sub(r"[^A-Za-z0-9_.-]", "", str(plan.get("id", ""))) or "?"
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={label}",
        f"#SBATCH --nodes={layout.hosts}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={gpus}",
        "#SBATCH --exclusive",
        f"# datarax plan {plan_id}: {layout.hardware}, {layout.hosts} hosts x "
        f"{gpus} GPUs, one JAX process per host.",
        "set -euo pipefail",
        "",
    ]
    if exported:
        lines.append("# Flags for XLA and the trainer (datarax launch config).")
        lines += [f"export {key}={q(value)}" for key, value in exported.items()]
        lines.append("")
    lines += [
        "# One process per node owns all its GPUs: without this, JAX's SLURM detection",
        "# would give each process only GPU SLURM_LOCALID (one process per GPU).",
        f"export JAX_LOCAL_DEVICE_IDS={','.join(map(str, range(gpus)))}",
        "# Process 0 (the first node) coordinates; MaxText's hardware=gpu reads these too.",
        'nodes="$(scontrol show hostnames "${SLURM_JOB_NODELIST:?run this script with sbatch}")"',
        "JAX_COORDINATOR_IP=\"${nodes%%$'\\n'*}\"",
        "export JAX_COORDINATOR_IP",
        f"export JAX_COORDINATOR_PORT={COORDINATOR_PORTS['gpu']}",
        'export JAX_COORDINATOR_ADDRESS="${JAX_COORDINATOR_IP}:${JAX_COORDINATOR_PORT}"',
        f"export NNODES={layout.hosts}",
        f"export JAX_NUM_PROCESSES={layout.hosts}",
        "",
        "# Each task's rank is SLURM_PROCID, known only inside the task.",
    ]
    srun = ["srun", f"--nodes={layout.hosts}", "--ntasks-per-node=1", f"--gpus-per-node={gpus}"]
    if image:
        srun.append(f"--container-image={q(image)}")
    rank = 'export NODE_RANK="${SLURM_PROCID}" JAX_PROCESS_ID="${SLURM_PROCID}"; exec "$@"'
    # The single quotes are meant: SLURM_PROCID and "$@" expand in each task's bash.
    lines.append("# shellcheck disable=SC2016")
    parts = [" ".join(srun), f"bash -c {q(rank)} bash", " ".join(map(q, argv))]
    lines.append(" \\\n  ".join(parts))
    return "\n".join(lines) + "\n"
