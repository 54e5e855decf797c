"""``python -m app.runtime``: the runtime process, started by the HTTP process (or a
follower host) through :class:`app.workers.runtime_client.RuntimeClient`::

    python -m app.runtime --fd N --parent-pid P --settings-json '{...}' [--command-module M ...]

It talks to its parent over the socket ``N`` (a ``socketpair`` end passed with
``pass_fds``; stdout stays free for JAX's logs) using the framing of :mod:`app.core.channel`,
and exits when that socket reaches EOF or its parent dies, so it never outlives the service.

Start-up order matters: the environment (``XLA_FLAGS``, ``JAX_PLATFORMS``: never unset, see
:func:`app.runtime.environment.runtime_platforms`) is set before anything imports JAX,
then the persistent compile cache is configured, then (multi-host) the runtime joins its
group before anything touches a device, then the command modules are loaded (the built-in
ones, :data:`app.runtime.server.BUILTIN_MODULES`, and the ``--command-module`` extras; a
follower loads the leader's extras instead of its own), and last JAX's backends start,
after which SIGTERM is a quiet exit (:func:`_quiet_signals`).

Exit status: 0 when the parent closed the channel; killed by SIGTERM (its default action,
no stack trace); 2 for a corrupt request stream; 1 when a follower lost its group;
:data:`app.runtime.group.EXIT_DIVERGED` and :data:`app.runtime.group.EXIT_LATE_JOINER` in
a group. A runtime of a group ends with
``os._exit`` (:func:`app.runtime.group.exit_now`): a normal interpreter shutdown would wait
for the other processes.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import signal
import socket
import sys

from app.core.channel import ChannelError
from app.core.logs import configure_logging
from app.core.settings import Settings
from app.runtime import environment, group, server

log = logging.getLogger("datarax.runtime")


def _die_with_parent(parent_pid: int | None) -> None:
    """Best effort: SIGKILL this process when the parent dies (Linux ``PR_SET_PDEATHSIG``)."""
    if sys.platform.startswith("linux"):
        try:
            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(0)  # the parent died before prctl took effect


def _quiet_signals() -> None:
    """SIGTERM ends this process at once and quietly (the default action), SIGINT is
    ignored (the parent stops the runtime: EOF, then SIGTERM, then SIGKILL).

    Called at start and again once JAX's backends are up: libtpu installs absl's failure
    signal handler, which turns a SIGTERM into a stack trace of every thread in the log.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _start_backends() -> None:
    """Starts JAX's backends (the handshake's ``devices`` would, a moment later), then
    :func:`_quiet_signals` again. A backend that fails to start is left to the handshake,
    which reports its error to the parent."""
    try:
        import jax

        jax.devices()
    except Exception as exc:  # reported by the devices command: same call, same error
        log.debug("JAX backends did not start here: %s", exc)
    _quiet_signals()


def main(argv: list[str] | None = None) -> int:
    """Runs the runtime process until its parent closes the channel; returns the exit
    status (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m app.runtime",
        description="The datarax runtime process: owns the JAX devices and runs device "
        "commands. Started and supervised by app.workers.runtime_client.RuntimeClient, "
        "not by hand.",
    )
    parser.add_argument("--fd", type=int, required=True, help="connected socket to the parent")
    parser.add_argument("--parent-pid", type=int, default=None)
    parser.add_argument("--settings-json", default=None, help="Settings as JSON (else from env)")
    parser.add_argument(
        "--command-module", action="append", default=[], help="extra command module to import"
    )
    args = parser.parse_args(argv)

    _die_with_parent(args.parent_pid)
    _quiet_signals()
    settings = Settings(**json.loads(args.settings_json)) if args.settings_json else Settings()
    # The service's format and level; the request id comes with each command (server.execute).
    configure_logging(settings.log_format, settings.log_level, process_label="runtime")
    environment.use_settings(settings)
    # Before anything imports jax: the device count and platform are fixed at backend start.
    os.environ.update(environment.runtime_environment(settings, os.environ))
    from app.runtime.compile_cache import configure_persistent_cache

    configure_persistent_cache(settings.data_dir)
    extras = list(args.command_module)
    command_group = None
    if settings.multihost:
        # Joins JAX's distributed runtime before any device use; followers load the
        # leader's extra modules so that every process knows every command.
        command_group = group.join_group(settings, extras)
        if command_group is not None and not command_group.is_leader:
            extras = group.leader_modules(command_group)
    server.load_command_modules((*server.BUILTIN_MODULES, *extras))
    _start_backends()

    sock = socket.socket(fileno=args.fd)
    sock.setblocking(True)
    status = 0
    try:
        status = server.serve(sock, command_group)
    except ChannelError as exc:
        log.error("corrupt request stream, exiting: %s", exc)
        status = 2
    except (BrokenPipeError, ConnectionResetError):
        status = 0
    finally:
        sock.close()
    if command_group is not None:
        group.exit_now(status)  # not through Python's shutdown: see exit_now
    return status


if __name__ == "__main__":
    sys.exit(main())
