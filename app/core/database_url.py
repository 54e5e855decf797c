"""The database setting's URL: whether a store location names PostgreSQL, and the URL
with its password hidden for messages and logs.

Below both of its users: the settings (:mod:`app.core.settings`) validate
``DATARAX_DATABASE_URL`` and name the store with it, and the storage package
(:mod:`app.storage.postgres`) picks its engine by it; so the settings import nothing of
the storage.
"""

from __future__ import annotations

import re
from pathlib import Path

_POSTGRES_SCHEME = re.compile(r"(?i)postgres(ql)?://")
_SECRET_NAME = re.compile(r"(?i)pass|secret|token|key")
"""Connection parameters whose value is hidden: ``password``, ``sslpassword``,
``passfile`` and ``sslkey`` (paths to secrets, hidden too), and anything named like a
secret or token."""
_DSN_SECRET = re.compile(r"(?i)\b(\w*(?:pass|secret|token|key)\w*)(\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)")


def is_postgres_url(location: str | Path) -> bool:
    """True for a ``postgresql://`` or ``postgres://`` URL (any case); False for a path.

    Example: ``is_postgres_url("postgresql://user@db:5432/x")`` is True,
    ``is_postgres_url(Path("var/datarax.sqlite"))`` False.
    """
    return isinstance(location, str) and _POSTGRES_SCHEME.match(location) is not None


def _hide_param(pair: str) -> str:
    name, equals, _ = pair.partition("=")
    return f"{name}=***" if equals and _SECRET_NAME.search(name) else pair


def redact(url: str) -> str:
    """``url`` with every secret part hidden, for messages and logs: the password of its
    user info, the value of each secret query parameter (libpq takes ``?password=``,
    ``sslpassword=``, ``sslkey=`` ...), and in a ``key=value`` connection string each
    secret key's value.

    Example: ``redact("postgresql://user:s3cret@db/x?password=p&sslmode=require")`` is
    ``"postgresql://user:***@db/x?password=***&sslmode=require"``; a URL without a
    secret comes back unchanged.
    """
    if "://" not in url:
        return _DSN_SECRET.sub(r"\1\2***", url)
    scheme, rest = url.split("://", 1)
    location, hash_, fragment = rest.partition("#")
    location, question, query = location.partition("?")
    # The user info ends at the last "@" (a password may hold "/" or "@" unescaped).
    userinfo, at, where = location.rpartition("@")
    if at and ":" in userinfo:
        location = f"{userinfo.split(':', 1)[0]}:***@{where}"
    query = "&".join(_hide_param(pair) for pair in query.split("&")) if query else query
    fragment = "***" if fragment else fragment
    return f"{scheme}://{location}{question}{query}{hash_}{fragment}"


def describe(url: str) -> str:
    """The database a PostgreSQL URL names, for answers: its host(s) and database, no user,
    no password, no parameters (an answer never carries a connection string).

    Example: ``describe("postgresql://u:p@db:5432/x?password=q")`` is
    ``"the PostgreSQL database x at db:5432"``.
    """
    if "://" not in url:
        return "the PostgreSQL database"
    rest = url.split("://", 1)[1].split("?", 1)[0].split("#", 1)[0]
    host, _, path = rest.rpartition("@")[2].partition("/")
    return f"the PostgreSQL database {path or '(the default)'} at {host or 'localhost'}"
