"""``datarax-serve``: the command line of every host, leader (HTTP) or follower.

Flags and ``DATARAX_*`` environment variables are one set of settings: pydantic-settings
reads both (a flag wins), so every setting has a flag (``--port``, ``--cpu-devices``,
``--num-processes``, ...; ``--help`` lists them), and a bad value of either is one clear
line naming the setting and an exit status of 2, not a traceback. The API token is the
exception: it is read from the environment only (a flag would show in ``ps``).

Process 0 (or a single-process service) serves HTTP; any other process of a multi-host
group supervises its runtime and serves nothing (:mod:`app.workers.follower`).
"""

from __future__ import annotations

import faulthandler
import sys
from types import FrameType

from pydantic import SecretStr, ValidationError
from pydantic_settings import CliSuppress, SettingsConfigDict

from app.api.connections import (
    FD_RESERVE,
    HEALTH_ROOM,
    GuardedHttpToolsProtocol,
    default_max_connections,
    raise_fd_limit,
)
from app.core.allocator import keep_freed_memory
from app.core.database_url import redact
from app.core.logs import configure_logging, log_config
from app.core.settings import Settings
from app.core.version import version_line
from app.storage.engines import store_at
from app.storage.errors import StoreUnreachable, StoreUnusable
from app.workers.follower import is_leader, run_follower

EXIT_BAD_SETTINGS = 2
EXIT_INTERRUPTED = 130
"""Stopped by Ctrl-C (SIGINT) after a graceful shutdown: 128 + SIGINT, as a shell reports."""
EXIT_DATABASE_UNREACHABLE = 69
"""The PostgreSQL server cannot be reached (sysexits' EX_UNAVAILABLE): a supervisor restarts
the service, which connects once the database is up."""
EXIT_BAD_DATABASE = 65
"""The database file cannot be used (sysexits' EX_DATAERR): restarting will not help, so a
supervisor can stop there (systemd ``RestartPreventExitStatus=65``)."""


HELP = """\
Serve the datarax mesh service: plan JAX device meshes, run sharded training steps
and compile checks, reduce and store per-device metrics (HTTP API and dashboard).

Every option can also be set by the environment variable shown beside it (a flag
wins). The API token is read from DATARAX_API_TOKEN only. Process 0 of a multi-host
group serves HTTP; the others serve nothing and keep their runtime in the group.
--version prints the versions and exits.
"""
"""``datarax-serve --help``'s description: plain text, what a terminal shows (the class
docstring below is for readers of the code, not for the command line)."""


class CliSettings(Settings):
    """The service settings with a flag for each field (kebab case).

    ``--help`` shows :data:`HELP` (``json_schema_extra['description']``, which
    pydantic-settings prefers to the docstring), each option's environment variable
    (``cli_show_env_vars``) and no ``null`` type in optional settings' metavars.
    """

    model_config = SettingsConfigDict(
        env_prefix="DATARAX_",
        extra="ignore",
        cli_prog_name="datarax-serve",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_exit_on_error=True,
        cli_show_env_vars=True,
        cli_hide_none_type=True,
        json_schema_extra={"description": HELP},
    )

    api_token: CliSuppress[SecretStr | None] = None


def setting_errors(error: ValidationError) -> list[str]:
    """One line per invalid setting: its variable and flag, what was given, what is wanted."""
    lines = []
    for entry in error.errors(include_url=False):
        name = ".".join(str(part) for part in entry.get("loc", ())) or "settings"
        where = f"DATARAX_{name.upper()} / --{name.replace('_', '-')}" if entry.get("loc") else name
        given = f" (got {entry['input']!r})" if "input" in entry and entry.get("loc") else ""
        if given and name in ("database_url", "api_token"):  # a password stays out of logs
            given = f" (got {redact(str(entry['input']))!r})" if name == "database_url" else ""
        lines.append(f"invalid setting {where}: {entry['msg']}{given}")
    return lines


def load_settings(argv: list[str] | None = None) -> Settings:
    """Settings from flags and ``DATARAX_*`` variables; exits 2 with one line per bad value."""
    argv = sys.argv[1:] if argv is None else argv
    if any(arg == "--api-token" or arg.startswith("--api-token=") for arg in argv):
        print(
            "datarax-serve: invalid setting --api-token: the token is read from "
            "DATARAX_API_TOKEN only (a flag would show in the process list)",
            file=sys.stderr,
        )
        sys.exit(EXIT_BAD_SETTINGS)
    try:
        parsed = CliSettings(_cli_parse_args=argv)
    except ValidationError as err:
        for line in setting_errors(err):
            print(f"datarax-serve: {line}", file=sys.stderr)
        sys.exit(EXIT_BAD_SETTINGS)
    # Back to the plain class, with the token from the environment (never a flag).
    values = parsed.model_dump(exclude={"api_token"})
    try:
        return Settings(**values)
    except ValidationError as err:
        for line in setting_errors(err):
            print(f"datarax-serve: {line}", file=sys.stderr)
        sys.exit(EXIT_BAD_SETTINGS)


def cli(argv: list[str] | None = None) -> None:
    """Entry point of ``datarax-serve``."""
    import uvicorn

    from app.main import create_app

    if "--version" in (sys.argv[1:] if argv is None else argv):
        print(version_line())  # package metadata only: nothing starts, no JAX backend
        sys.exit(0)
    settings = load_settings(argv)
    configure_logging(settings.log_format, settings.log_level)
    # A fatal signal (SIGSEGV, SIGBUS, SIGABRT) leaves its Python traceback in the log.
    faulthandler.enable()
    if not is_leader(settings):
        # Processes other than 0 serve no HTTP: they only keep their runtime in the group.
        sys.exit(run_follower(settings))
    # Large bodies: reuse freed heap memory instead of page-faulting fresh mmap pages,
    # up to DATARAX_MALLOC_KEEP_MB of it (see app/core/allocator.py, issue 41).
    keep_freed_memory(int(settings.malloc_keep_mb * 1024 * 1024))
    max_connections = connection_bound(settings)  # a bound that cannot fit: exit 2 first
    check_database(settings)
    app = create_app(settings)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # From the first SIGTERM/SIGINT on, a request cancelled when the grace period
            # ends answers 503 shutting_down (app.api.middleware.ShutdownMiddleware).
            app.state.lifecycle.shutting_down = True
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        # One format for our lines and uvicorn's (app.core.logs); the access line carries the
        # request id because uvicorn logs it inside the request's context.
        log_config=log_config(settings.log_format, settings.log_level),
        proxy_headers=False,
        # uvicorn annotates an int but hands it to asyncio.wait_for, which takes seconds
        # as a float: 2.5 s of grace stays 2.5 s.
        timeout_graceful_shutdown=settings.shutdown_grace_s,  # type: ignore[arg-type]
        # C parser and event loop (both dependencies): h11's pure-Python parser and the
        # asyncio loop cost more per request than most handlers. The parser's own 400s
        # are problem JSON, and heads past DATARAX_MAX_HEADER_KB / DATARAX_MAX_HEADERS are
        # 431 before they are held (ProblemHttpToolsProtocol).
        # Idle, slow-head, slow-body and unread-answer connections are closed, and the
        # connections a process holds are bounded (app.api.connections).
        http=GuardedHttpToolsProtocol.configured(
            max_head_bytes=settings.max_header_bytes,
            max_headers=settings.max_headers,
            header_timeout_s=settings.header_timeout_s,
            body_timeout_s=settings.body_timeout_s,
            write_timeout_s=settings.write_timeout_s,
            max_connections=max_connections,
        ),
        timeout_keep_alive=settings.keep_alive_s,  # type: ignore[arg-type]
        loop="uvloop",
    )
    try:
        Server(config).run()
    except KeyboardInterrupt:
        # Ctrl-C: uvicorn shuts down gracefully, then raises SIGINT again with Python's
        # handler, which would end the process with a KeyboardInterrupt traceback.
        sys.exit(EXIT_INTERRUPTED)


def connection_bound(settings: Settings) -> int:
    """Raises the soft file-descriptor limit to the hard one and returns the connection
    bound; exits 2 with one line when ``DATARAX_MAX_CONNECTIONS`` does not fit the limit."""
    fd_limit = raise_fd_limit()
    room = default_max_connections(fd_limit)
    if settings.max_connections is None:
        return room
    if settings.max_connections > room:
        print(
            f"datarax-serve: invalid setting DATARAX_MAX_CONNECTIONS / --max-connections: "
            f"{settings.max_connections} connections do not fit this process's limit of "
            f"{fd_limit} file descriptors ({FD_RESERVE + HEALTH_ROOM} are kept for files and "
            f"health checks); set at most {room}, or raise the limit (ulimit -n, LimitNOFILE=)",
            file=sys.stderr,
        )
        sys.exit(EXIT_BAD_SETTINGS)
    return settings.max_connections


def check_database(settings: Settings) -> None:
    """Opens the database once before serving; exits 65 with one line if it is unusable.

    A corrupt, truncated or unreadable file is never overwritten or repaired here: the
    line names the path and what to do.
    """
    store = store_at(settings.store_location)
    try:
        store.open()
    except (StoreUnusable, OSError) as err:
        if settings.database_url is not None:
            print(f"datarax-serve: {' '.join(str(err).split())}", file=sys.stderr)
            unreachable = isinstance(err, StoreUnreachable)
            sys.exit(EXIT_DATABASE_UNREACHABLE if unreachable else EXIT_BAD_DATABASE)
        print(
            f"datarax-serve: cannot use the database {settings.db}: {err}. The file was left "
            "untouched; restore it from a backup, move it aside to start empty, or point "
            "DATARAX_DB / --db elsewhere",
            file=sys.stderr,
        )
        sys.exit(EXIT_BAD_DATABASE)
    finally:
        store.close()


if __name__ == "__main__":
    cli()
