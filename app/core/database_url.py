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
_PASSWORD = re.compile(r"(?i)(://[^:/@]+):[^@]*@")


def is_postgres_url(location: str | Path) -> bool:
    """True for a ``postgresql://`` or ``postgres://`` URL (any case); False for a path.

    Example: ``is_postgres_url("postgresql://user@db:5432/x")`` is True,
    ``is_postgres_url(Path("var/datarax.sqlite"))`` False.
    """
    return isinstance(location, str) and _POSTGRES_SCHEME.match(location) is not None


def redact(url: str) -> str:
    """``url`` with its password (if any) hidden, for messages and logs.

    Example: ``redact("postgresql://user:s3cret@db/x")`` is
    ``"postgresql://user:***@db/x"``; a URL without a password comes back unchanged.
    """
    return _PASSWORD.sub(r"\1:***@", url)
