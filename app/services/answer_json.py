"""Answers of the hot paths (job pushes and history, metric reductions) as JSON bytes,
always from their classes (:mod:`datarax.answers`), with two aids:

- :func:`stored`: JSON text the store keeps (a step's reduced values, its spread) placed
  into an answer as it is: orjson writes an ``orjson.Fragment`` verbatim, so a stored
  value is neither parsed nor encoded again;
- :func:`template`: the JSON of an answer built with placeholder members (:data:`INT`,
  :data:`TEXT`), a ``bytes`` %-format. A history page writes thousands of rows with it,
  each in a third of a microsecond where building and serialising the answer instance
  takes four (``benchmarks/jobs.py``, ``full_read_s``), and a reduction its answer in one
  where ``to_json`` takes three; the member names, their order and which are left out
  all come from the class, since the template is the class's own ``to_json``.
"""

from __future__ import annotations

from typing import Any

import orjson

from datarax.answers.base import Answer

INT: Any = orjson.Fragment(b"%d")
"""A template's placeholder for an integer member (``%d``)."""
TEXT: Any = orjson.Fragment(b"%s")
"""A template's placeholder for a member given as JSON bytes (``%s``)."""
NULL: Any = orjson.Fragment(b"null")
"""An :func:`~datarax.answers.base.omitted` member sent as ``null`` all the same, where the
service has always sent it so (a partial history row's ``missing_sources`` when the
missing sources cannot be named): ``None`` would leave it out."""


def stored(text: str | bytes) -> Any:
    """JSON text as stored, as a member of an answer: written verbatim by :func:`dumps`."""
    return orjson.Fragment(text)


def dumps(answer: Answer) -> bytes:
    """The answer's JSON (:meth:`~datarax.answers.base.Answer.to_json`), stored members as
    they are."""
    return orjson.dumps(answer.to_json())


def template(answer: Answer) -> bytes:
    """The answer's JSON as a ``bytes`` %-format: its :data:`INT` and :data:`TEXT` members
    are ``%d`` and ``%s`` (in field order), the others written as given.

    Raises:
      ValueError: a member given as a value holds a ``%`` (it would be read as a format).
    """
    out = dumps(answer)
    holes = sum(1 for value in answer.values() if value is INT or value is TEXT)
    if out.count(b"%") != holes:
        raise ValueError(f"a constant member of {type(answer).__name__}'s template holds a '%'")
    return out
