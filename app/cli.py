"""``datarax-serve``: the command line of every host, leader (HTTP) or follower.

Flags and ``DATARAX_*`` environment variables are one set of settings: pydantic-settings
reads both (a flag wins), so every setting has a flag (``--port``, ``--cpu-devices``,
``--num-processes``, ...; ``--help`` lists them), and a bad value of either is one clear
line naming the setting and an exit status of 2, not a traceback. The API token is the
exception: it is read from the environment only (a flag would show in ``ps``).

Process 0 (or a single-process service) serves HTTP; any other process of a multi-host
group supervises its runtime and serves nothing (:mod:`app.follower`).
"""

from __future__ import annotations

import logging
import sys

from pydantic import SecretStr, ValidationError
from pydantic_settings import CliSuppress, SettingsConfigDict

from app.allocator import keep_freed_memory
from app.follower import is_leader, run_follower
from app.settings import Settings

EXIT_BAD_SETTINGS = 2


class CliSettings(Settings):
    """:class:`~app.settings.Settings` with a flag for each field (kebab case)."""

    model_config = SettingsConfigDict(
        env_prefix="DATARAX_",
        extra="ignore",
        cli_prog_name="datarax-serve",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_exit_on_error=True,
    )

    api_token: CliSuppress[SecretStr | None] = None


def setting_errors(error: ValidationError) -> list[str]:
    """One line per invalid setting: its variable and flag, what was given, what is wanted."""
    lines = []
    for entry in error.errors(include_url=False):
        name = ".".join(str(part) for part in entry.get("loc", ())) or "settings"
        where = f"DATARAX_{name.upper()} / --{name.replace('_', '-')}" if entry.get("loc") else name
        given = f" (got {entry['input']!r})" if "input" in entry and entry.get("loc") else ""
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

    settings = load_settings(argv)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    if not is_leader(settings):
        # Processes other than 0 serve no HTTP: they only keep their runtime in the group.
        sys.exit(run_follower(settings))
    # Large bodies: reuse freed heap memory instead of page-faulting fresh mmap pages
    # (see app/allocator.py); keeps up to ~4 bodies' worth of freed memory.
    keep_freed_memory(max(256 * 1024 * 1024, 4 * settings.max_body_bytes))
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        proxy_headers=False,
        timeout_graceful_shutdown=10,
        # C parser and event loop (both dependencies): h11's pure-Python parser and the
        # asyncio loop cost more per request than most handlers.
        http="httptools",
        loop="uvloop",
    )


if __name__ == "__main__":
    cli()
