"""A plan as a Kubernetes JobSet for GKE (DESIGN v1.2 "Launching a plan", target ``jobset``).

:func:`jobset_manifest` writes a ``jobset.x-k8s.io/v1alpha2`` JobSet; :func:`to_yaml` its
YAML. The process model is :mod:`datarax.launch.slurm`'s: one pod (one JAX
process) per TPU VM or GPU host.

- TPU: one replicated job ``slice`` with ``replicas`` = slices; each an Indexed Job of one
  pod per TPU VM of the slice (``parallelism`` = ``completions`` = VMs per slice,
  ``backoffLimit: 0``), on GKE's TPU node labels ``cloud.google.com/gke-tpu-accelerator``
  and ``cloud.google.com/gke-tpu-topology``, ``google.com/tpu`` = chips per VM, the TPU
  taint tolerated, one slice per node pool (``alpha.jobset.sigs.k8s.io/exclusive-topology:
  cloud.google.com/gke-nodepool``) and, with several slices, the ``MEGASCALE_*``
  variables from JobSet's own labels and annotations.
- GPU: one replicated job ``host`` of one Indexed Job with one pod per host,
  ``nvidia.com/gpu`` = GPUs per host, on ``cloud.google.com/gke-accelerator``, with the
  coordinator address, process count and process id (the pod's completion index).

Sources:

- AI-Hypercomputer/xpk at commit ``367c838253bea41e7d7716145ad6513f44c1a21e`` (2026-06-25,
  after v1.13.0): GKE accelerator names (``src/xpk/core/system_characteristics.py``:
  ``tpu-v4-podslice``, ``tpu-v5-lite-podslice``, ``tpu-v5p-slice``, ``tpu-v6e-slice``,
  ``nvidia-h100-80gb``, ``nvidia-h200-141gb``, ``nvidia-b200``, ``nvidia-gb200``; node
  label keys in ``AcceleratorTypeToAcceleratorCharacteristics``), the JobSet shape
  (``src/xpk/commands/workload.py``: ``WORKLOAD_CREATE_YAML``, ``hostNetwork`` with
  ``ClusterFirstWithHostNet``, the ``google.com/tpu`` toleration; container ports 8471 /
  8080 and 6002 in ``src/xpk/core/docker_resources.py``), the exclusive-topology
  annotation (``src/xpk/core/scheduling.py``), the downward-API variables
  (``get_gpu_env``: ``JAX_COORDINATOR_ADDRESS =
  $(JOBSET_NAME)-$(REPLICATED_JOB_NAME)-0-0.$(JOBSET_NAME)``, ``NODE_RANK`` from
  ``batch.kubernetes.io/job-completion-index``; ``templates/pathways_workload_create.yaml
  .j2``: ``MEGASCALE_NUM_SLICES`` from the label ``jobset.sigs.k8s.io/replicatedjob-
  replicas``, ``MEGASCALE_SLICE_ID`` from the label ``jobset.sigs.k8s.io/job-index``).
- kubernetes-sigs/jobset v0.12.0 (commit ``f22e565ac3cc3265c7c45ef67ecffdc689af5d77``):
  the CRD the manifest is tested against (``tests/vendor/jobset/``), the label and
  annotation keys (``api/jobset/v1alpha2/jobset_types.go``, set on every pod by
  ``pkg/controllers/jobset_controller.go::labelAndAnnotateObject``), pod hostnames
  ``<jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<jobset>`` (``network.
  enableDNSHostnames``), and the webhook's name-length rule (:func:`launch_slurm.job_name`).
- GKE docs, "Deploy TPU workloads in GKE Standard" and "TPUs in GKE"
  (https://cloud.google.com/kubernetes-engine/docs/how-to/tpus): TPU nodes carry the
  ``google.com/tpu`` ``NoSchedule`` taint; GKE injects ``TPU_WORKER_ID`` and
  ``TPU_WORKER_HOSTNAMES`` into Indexed Jobs' pods, which JAX's GKE detection reads.
- Kueue: the ``kueue.x-k8s.io/queue-name`` label names the LocalQueue
  (https://kueue.sigs.k8s.io/docs/tasks/run/jobsets/).

Example:
  >>> manifest = jobset_manifest(plan, args=[], env={}, image="maxtext:latest")  # doctest: +SKIP
  >>> manifest["spec"]["replicatedJobs"][0]["replicas"]  # doctest: +SKIP
  2
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from datarax.hardware.chips import get_hardware
from datarax.json_types import JSONObject
from datarax.launch.slurm import (
    COORDINATOR_PORTS,
    ProcessLayout,
    check_env,
    default_command,
    job_name,
    process_layout,
)

__all__ = [
    "API_VERSION",
    "GKE_ACCELERATORS",
    "jobset_manifest",
    "to_yaml",
]

API_VERSION = "jobset.x-k8s.io/v1alpha2"

GKE_ACCELERATORS: Mapping[str, str] = {
    "tpu-v4": "tpu-v4-podslice",
    "tpu-v5e": "tpu-v5-lite-podslice",
    "tpu-v5p": "tpu-v5p-slice",
    "tpu-v6e": "tpu-v6e-slice",
    "tpu7x": "tpu7x",
    "h100-sxm": "nvidia-h100-80gb",
    "h100-a3-high": "nvidia-h100-80gb",
    "h200-sxm": "nvidia-h200-141gb",
    "b200": "nvidia-b200",
    "gb200-nvl72": "nvidia-gb200",
    "a100-sxm": "nvidia-a100-80gb",
    "v100-sxm": "nvidia-tesla-v100",
}
"""Catalog name -> GKE node label value (``cloud.google.com/gke-tpu-accelerator`` on TPU,
``cloud.google.com/gke-accelerator`` on GPU), as xpk ``367c838``'s
``system_characteristics.py`` names them (h100-sxm and h100-a3-high: the A3 High
``a3-highgpu-8g``); xpk has no A100 80GB or V100 system, so those two are Compute
Engine's GPU type names, which GKE puts in that label
(https://cloud.google.com/compute/docs/gpus: ``nvidia-a100-80gb``, ``nvidia-tesla-v100``)."""

_TPU_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
_TPU_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
_GPU_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
_EXCLUSIVE = "alpha.jobset.sigs.k8s.io/exclusive-topology"
_NODE_POOL = "cloud.google.com/gke-nodepool"
_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
_JOBSET_NAME_KEY = "jobset.sigs.k8s.io/jobset-name"
_REPLICATED_JOB_KEY = "jobset.sigs.k8s.io/replicatedjob-name"
_REPLICAS_KEY = "jobset.sigs.k8s.io/replicatedjob-replicas"
_JOB_INDEX_KEY = "jobset.sigs.k8s.io/job-index"
_COMPLETION_INDEX_KEY = "batch.kubernetes.io/job-completion-index"
_FIRST_POD = "$(JOBSET_NAME)-$(REPLICATED_JOB_NAME)-0-0.$(JOBSET_NAME)"
_CONTAINER = "train"


def _from_field(name: str, path: str) -> JSONObject:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _annotation(key: str) -> str:
    return f"metadata.annotations['{key}']"


def _label(key: str) -> str:
    return f"metadata.labels['{key}']"


def _launcher_env(layout: ProcessLayout) -> list[JSONObject]:
    """The variables that tell each JAX process where it is (before the caller's env, as
    ``$(VAR)`` references only see variables defined earlier in the list)."""
    env = [
        _from_field("JOBSET_NAME", _annotation(_JOBSET_NAME_KEY)),
        _from_field("REPLICATED_JOB_NAME", _annotation(_REPLICATED_JOB_KEY)),
    ]
    if layout.kind == "tpu":
        # One slice needs no DCN: JAX's TPU detection then takes TPU_WORKER_HOSTNAMES[0]
        # as its coordinator (jax/_src/clusters/cloud_tpu_cluster.py).
        if layout.slices > 1:
            env += [
                {"name": "MEGASCALE_COORDINATOR_ADDRESS", "value": _FIRST_POD},
                _from_field("MEGASCALE_NUM_SLICES", _label(_REPLICAS_KEY)),
                _from_field("MEGASCALE_SLICE_ID", _label(_JOB_INDEX_KEY)),
            ]
        return env
    port = str(COORDINATOR_PORTS["gpu"])
    ids = ",".join(str(i) for i in range(layout.devices_per_host))
    return env + [
        _from_field("JAX_PROCESS_ID", _annotation(_COMPLETION_INDEX_KEY)),
        _from_field("NODE_RANK", _annotation(_COMPLETION_INDEX_KEY)),
        {"name": "JAX_NUM_PROCESSES", "value": str(layout.hosts)},
        {"name": "NNODES", "value": str(layout.hosts)},
        {"name": "JAX_COORDINATOR_PORT", "value": port},
        # MaxText's hardware=gpu reads the IP (a resolvable hostname works) and port;
        # JAX itself reads JAX_COORDINATOR_ADDRESS as host:port (jax/_src/distributed.py).
        {"name": "JAX_COORDINATOR_IP", "value": _FIRST_POD},
        {
            "name": "JAX_COORDINATOR_ADDRESS",
            "value": "$(JAX_COORDINATOR_IP):$(JAX_COORDINATOR_PORT)",
        },
        {"name": "JAX_LOCAL_DEVICE_IDS", "value": ids},
    ]


def _container_env(layout: ProcessLayout, env: Mapping[str, str]) -> list[JSONObject]:
    given = check_env(env)
    # A given variable takes the launcher's place in the list, so that the $(VAR)
    # references after it still see it.
    out: list[JSONObject] = []
    for entry in _launcher_env(layout):
        name = str(entry["name"])
        out.append({"name": name, "value": given[name]} if name in given else entry)
    placed = {entry["name"] for entry in out}
    return out + [
        {"name": key, "value": value} for key, value in given.items() if key not in placed
    ]


def _pod_spec(layout: ProcessLayout, container: dict[str, Any]) -> JSONObject:
    accelerator = GKE_ACCELERATORS[layout.hardware]
    if layout.kind == "tpu":
        node_selector = {_TPU_ACCELERATOR_LABEL: accelerator, _TPU_TOPOLOGY_LABEL: layout.topology}
        toleration = {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}
    else:
        node_selector = {_GPU_ACCELERATOR_LABEL: accelerator}
        toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    return {
        "restartPolicy": "Never",
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "nodeSelector": node_selector,
        "tolerations": [toleration],
        "containers": [container],
    }


def jobset_manifest(
    plan: Mapping[str, Any],
    *,
    args: Sequence[str],
    env: Mapping[str, str],
    image: str,
    command: Sequence[str] | None = None,
    name: str | None = None,
    queue: str | None = None,
) -> JSONObject:
    """The JobSet that runs ``command`` on every host of ``plan`` (the module docstring
    says what it holds and where each field comes from).

    Args:
      plan: a stored TPU or GPU hardware plan (``POST /v1/meshes``' answer) or its summary.
      args: MaxText's ``key=value`` arguments (the default command's tail).
      env: variables for every pod (``LIBTPU_INIT_ARGS``, ``XLA_FLAGS``, ...), after the
        launcher's own; a name given here replaces the launcher's variable of that name.
      image: the container image.
      command: the container's command (default
        :func:`datarax.launch.slurm.default_command` with ``args``).
      name: the JobSet's name (default: the plan's name, else its id), made a DNS-1035
        label short enough for JobSet's pod names (:func:`launch_slurm.job_name`).
      queue: Kueue LocalQueue: sets the ``kueue.x-k8s.io/queue-name`` label.

    Returns:
      The manifest as plain dicts and lists (JSON- and YAML-ready).

    Raises:
      PlanError: ``launch_target_unavailable`` for a plan without TPU or GPU hardware
        (:func:`launch_slurm.process_layout`).
      ValueError: an empty ``image`` or ``command``, or a bad ``env`` entry.
    """
    layout = process_layout(plan)
    if not isinstance(image, str) or not image.strip():
        raise ValueError(f"image {image!r} is empty; give the container image to run")
    argv = list(command) if command else default_command(args)
    if not argv or not all(isinstance(part, str) for part in argv):
        raise ValueError(f"command {command!r} must be a non-empty list of strings")
    label = job_name(plan, name)
    if layout.kind == "tpu":
        # GKE counts chips (tpu7x-standard-4t: 4), JAX devices (TPU7x: 2 a chip) aside
        per_chip = get_hardware(layout.hardware).devices_per_chip
        resources = {"google.com/tpu": layout.devices_per_host // per_chip}
        ports = [8471, 8080]
    else:
        resources = {"nvidia.com/gpu": layout.devices_per_host}
        ports = [COORDINATOR_PORTS["gpu"]]
    container = {
        "name": _CONTAINER,
        "image": image,
        "command": argv,
        "env": _container_env(layout, env),
        "ports": [{"containerPort": port} for port in ports],
        "resources": {"limits": resources},
    }
    metadata: dict[str, Any] = {"name": label}
    if queue:
        metadata["labels"] = {_QUEUE_LABEL: queue}
    if layout.kind == "tpu":
        # One slice per node pool, as xpk does for every TPU workload (scheduling.py).
        metadata["annotations"] = {_EXCLUSIVE: _NODE_POOL}
    job: JSONObject = {
        "parallelism": layout.pods_per_job,
        "completions": layout.pods_per_job,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "template": {"spec": _pod_spec(layout, container)},
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "JobSet",
        "metadata": metadata,
        "spec": {
            "failurePolicy": {"maxRestarts": 0},
            "network": {"enableDNSHostnames": True},
            "replicatedJobs": [
                {
                    "name": layout.replicated_job,
                    "replicas": layout.replicas,
                    "template": {"spec": job},
                }
            ],
        },
    }


def to_yaml(manifest: Mapping[str, Any]) -> str:
    """``manifest`` as YAML (PyYAML's ``safe_dump``, keys in the manifest's order)."""
    text: str = yaml.safe_dump(dict(manifest), sort_keys=False, default_flow_style=False)
    return text
