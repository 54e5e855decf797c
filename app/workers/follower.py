"""Multi-host service: one JAX distributed runtime across processes, HTTP on process 0.

Every host runs the same command, differing only in the process id::

    datarax-serve --coordinator 10.0.0.1:7777 --num-processes 4 --process-id I

(or ``DATARAX_COORDINATOR`` / ``DATARAX_NUM_PROCESSES`` / ``DATARAX_PROCESS_ID``; or
``DATARAX_DISTRIBUTED=true`` with nothing else where JAX detects the cluster: SLURM,
Open MPI, Kubernetes indexed Jobs and JobSets, Cloud TPU).

Roles:

- Process 0 (the *leader*) serves HTTP (:func:`is_leader`). Its runtime process hosts
  JAX's coordination service (at ``coordinator``) and is the only runtime the HTTP
  process talks to.
- Every other process is a *follower* (:func:`run_follower`; ``datarax-serve`` of
  :mod:`app.cli` calls it for any process id but 0): no HTTP; it supervises its own
  runtime process and restarts it when it dies, until SIGTERM or SIGINT.

How the runtimes run every command together, and what happens when one is lost, is told
in :mod:`app.runtime.group`.

The coordination service has no authentication unless JAX's mTLS options
(``jax_mtls_cert_file`` and friends) are set: keep the coordinator port on a private
network, like the HTTP port without ``DATARAX_API_TOKEN``.

Deployment notes:

- Kubernetes: an indexed Job (``completionMode: Indexed``, ``completions`` =
  ``parallelism`` = N) with ``subdomain`` naming a headless Service (``clusterIP: None``,
  ``publishNotReadyAddresses: true``, selector ``job-name``); each pod runs ``datarax-serve
  --host 0.0.0.0 --coordinator <job>-0.<service>:7777 --num-processes N --process-id
  $(JOB_COMPLETION_INDEX)``. Route HTTP with a Service selecting
  ``batch.kubernetes.io/job-completion-index: "0"``; HTTP probes belong on that pod only
  (followers serve no HTTP). ``DATARAX_DISTRIBUTED=true`` instead of the flags needs
  ``jax[k8s]`` and RBAC to read pods and jobs (JAX asks the API server; port 55527 unless
  ``JAX_COORDINATOR_PORT``). A JobSet works alike; its coordinator is
  ``<jobset>-<job>-0-0.<jobset>``.
- SLURM: ``srun --nodes=N --ntasks-per-node=1`` with ``DATARAX_DISTRIBUTED=true``; JAX
  takes the coordinator (first node, port from the job id), N (``SLURM_NTASKS``) and the id
  (``SLURM_PROCID``). With one task per GPU host set ``JAX_LOCAL_DEVICE_IDS=0,1,...``:
  otherwise JAX gives each task only GPU ``SLURM_LOCALID``. HTTP is on the node of
  ``SLURM_PROCID=0``.
- ``DATARAX_RUNTIME_START_TIMEOUT_S`` should exceed ``DATARAX_DISTRIBUTED_INIT_TIMEOUT_S``
  plus the import time, or the supervisor kills a runtime still waiting for its peers
  (harmless, but it hides the clearer "peer missing" exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

from app.core.settings import Settings
from app.runtime.group import process_id_of
from app.workers.runtime_client import RuntimeClient

log = logging.getLogger("datarax.multihost")


def is_leader(settings: Settings) -> bool:
    """Whether this process serves HTTP: single-process services and process 0.

    Raises:
      ValueError: ``DATARAX_DISTRIBUTED`` is on but no process id is given or detectable.
    """
    if not settings.multihost:
        return True
    pid = process_id_of(settings)
    if pid is None:
        raise ValueError(
            "DATARAX_DISTRIBUTED is on but this process's id could not be detected (no "
            "SLURM, Open MPI, Kubernetes indexed Job or Cloud TPU environment found); "
            "pass --process-id (DATARAX_PROCESS_ID)"
        )
    return pid == 0


def run_follower(settings: Settings) -> int:
    """Main of a follower host: supervises the local runtime process until SIGTERM/SIGINT.

    No HTTP. The runtime joins the JAX group and executes the commands the leader fans
    out; whenever it dies (the group aborted, its peer died) it is restarted with
    backoff, so the group re-forms when every process is back.

    Args:
      settings: multi-host settings of a process other than 0.

    Returns:
      The process exit status (0 after a signal).

    Raises:
      ValueError: the settings are not multi-host, or name process 0.
    """
    if not settings.multihost:
        raise ValueError("run_follower needs multi-host settings (coordinator or distributed)")
    if is_leader(settings):
        raise ValueError("process 0 serves HTTP: run datarax-serve there, not a follower")
    return asyncio.run(_supervise_runtime(settings))


async def _supervise_runtime(settings: Settings) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    client = RuntimeClient(settings)
    await client.start()
    log.info("follower %s: supervising the runtime process", process_id_of(settings))
    ready = False
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            if client.ready != ready:
                ready = client.ready
                log.info("follower runtime %s", "joined the group" if ready else "lost")
    finally:
        await client.stop()
    return 0
