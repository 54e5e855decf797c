"""How the HTTP process supervises its child processes: the device runtime
(:mod:`app.workers.runtime_client`) and the compile worker (:mod:`app.workers.compile_worker`).

Both children are spawned the same way and ended the same way:

- :meth:`Child.spawn` starts ``argv`` in a session (and so a process group) of its own,
  from the project root with the given environment, so that a kill reaches whatever the
  child started (libtpu's helpers, ``ptxas``) and a signal meant for the service (a
  terminal's Ctrl-C) never reaches the child directly;
- :meth:`Child.signal_group` signals that group; :meth:`Child.wait` never waits longer
  than asked; :meth:`Child.stop` ends a child in stages (each stage a signal, or its input
  closed, and a grace period), the last of which is SIGKILL;
- :class:`Backoff` is the restart policy of a child that must always be there (the
  runtime): a delay that doubles up to a ceiling and is reset once a child has lived long
  enough; a child that runs on demand (the compile worker) is simply spawned again by the
  next piece of work;
- :func:`group_rss_bytes` is the health figure of a child that cannot be capped by the
  kernel (a GPU compile worker): the resident memory of its process group.

Nothing here imports JAX, and nothing blocks the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parents[2]
"""Where ``python -m app.<child>`` resolves: the children are started from here."""

Stage = tuple[int | None, float | None]
"""One step of :meth:`Child.stop`: a signal for the group (``None``: close the child's
input, or send nothing) and how long to wait for the exit then (``None``: until it exits)."""


class Child:
    """A child process in its own process group (its pid is the group's id).

    Built by :meth:`spawn`; ``proc`` is the asyncio process, for its pipes.
    """

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc

    @classmethod
    async def spawn(
        cls,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | Path | None = None,
        stdin: int | None = asyncio.subprocess.DEVNULL,
        stdout: int | None = None,
        stderr: int | None = None,
        pass_fds: Sequence[int] = (),
        limit: int | None = None,
    ) -> Child:
        """Starts ``argv`` (program first) in a new session.

        Args:
          argv: the command line.
          env: the child's whole environment.
          cwd: its working directory (default: the service's).
          stdin, stdout, stderr: as for :func:`asyncio.create_subprocess_exec`
            (``asyncio.subprocess.PIPE``, ``DEVNULL`` or ``None`` to inherit).
          pass_fds: file descriptors the child keeps (the runtime's socket).
          limit: the buffer limit of its pipes' stream readers (asyncio's default if None).

        Raises:
          OSError: the program could not be started.
        """
        extra: dict[str, Any] = {} if limit is None else {"limit": limit}
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            cwd=None if cwd is None else str(cwd),
            env=dict(env),
            pass_fds=tuple(pass_fds),
            start_new_session=True,
            **extra,
        )
        return cls(proc)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        """The exit status (negative: the signal), ``None`` while it runs."""
        return self.proc.returncode

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    def signal_group(self, signum: int) -> None:
        """Sends ``signum`` to the child's process group, while the child runs."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signum)

    def kill(self) -> None:
        """SIGKILL to the child's process group (XLA cannot be interrupted otherwise)."""
        self.signal_group(signal.SIGKILL)

    async def wait(self, timeout: float | None = None) -> int | None:  # noqa: ASYNC109 - bounded wait is the point
        """Waits up to ``timeout`` seconds (``None``: for ever) for the exit; returns the
        exit status, ``None`` if the child still runs."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proc.wait(), timeout)
        return self.proc.returncode

    async def stop(self, stages: Sequence[Stage]) -> int | None:
        """Ends the child in ``stages``, returning at the first that sees it exit.

        A stage with no signal closes the child's input where it has a pipe (an idle
        child reads EOF and exits through its own shutdown), then waits its grace.
        Returns the exit status, ``None`` if the child outlived every stage.
        """
        for signum, grace in stages:
            if signum is None:
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
            else:
                self.signal_group(signum)
            if await self.wait(grace) is not None:
                break
        return self.proc.returncode


def describe_exit(returncode: int) -> str:
    """``signal N`` for a child killed by signal N, else ``code N``."""
    return f"signal {-returncode}" if returncode < 0 else f"code {returncode}"


class Backoff:
    """The restart delay of a child that must always run.

    ``initial_s`` doubling on each restart up to ``max_s``; back to ``initial_s`` once a
    child has lived ``healthy_after_s`` (:meth:`lived`), so a child that crashes now and
    then restarts at once and one that crashes at start does not spin.
    """

    def __init__(self, initial_s: float, max_s: float, healthy_after_s: float):
        self.initial_s = initial_s
        self.max_s = max_s
        self.healthy_after_s = healthy_after_s
        self.delay_s = initial_s
        """What the next :meth:`sleep` waits."""

    async def sleep(self) -> None:
        """Waits the current delay, then doubles it (up to the ceiling)."""
        await asyncio.sleep(self.delay_s)
        self.delay_s = min(2 * self.delay_s, self.max_s)

    def lived(self, seconds: float) -> None:
        """The last child ran ``seconds``: long enough resets the delay."""
        if seconds >= self.healthy_after_s:
            self.delay_s = self.initial_s


def group_rss_bytes(pgid: int) -> int:
    """Resident memory of every process in process group ``pgid`` (Linux ``/proc``; 0
    elsewhere): the GPU worker and anything it runs (``ptxas``)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # from field 3 (state) on
        if len(fields) > 21 and int(fields[2]) == pgid:  # field 5: pgrp; field 24: rss
            total += int(fields[21]) * page
    return total


__all__ = ["PROJECT_ROOT", "Backoff", "Child", "Stage", "describe_exit", "group_rss_bytes"]
