"""Suggestions for mistyped names: the nearest valid one, said the same way everywhere.

Example:
  >>> did_you_mean("fsdb", ["data", "fsdp", "tensor"])
  " (did you mean 'fsdp'?)"
  >>> did_you_mean("zzz", ["data", "fsdp"])
  ''
  >>> did_you_mean("fsdp", ["data", "fsdp"])
  ''
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["did_you_mean", "nearest"]


def nearest(name: object, choices: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The valid name closest to ``name`` (``difflib``'s ratio at least ``cutoff``,
    case ignored), or ``None``."""
    if not isinstance(name, str):
        return None
    options = [option for option in choices if option != name]
    # (a name is never its own suggestion: it is valid elsewhere, not here; another case
    # of it is)
    lowered = {option.lower(): option for option in options}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=cutoff)
    return lowered[close[0]] if close else None


def did_you_mean(name: object, choices: Iterable[str], cutoff: float = 0.6) -> str:
    """``" (did you mean 'x'?)"`` for the nearest valid name, or ``""`` without one."""
    close = nearest(name, choices, cutoff)
    return f" (did you mean {close!r}?)" if close is not None else ""
