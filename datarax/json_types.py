"""JSON values as types: what the library's documents (launch configs, manifests, plan
requests, catalog entries) hold, checked by mypy instead of ``Any``.

Example:
  >>> doc: JSONObject = {"ici": {"fsdp": 8}, "notes": ["one"], "fits": None}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["JSONObject", "JSONValue"]

type JSONValue = None | bool | int | float | str | Sequence[JSONValue] | Mapping[str, JSONValue]
"""Any JSON value; arrays and objects read-only (covariant), so a ``list[str]`` or a
``dict[str, int]`` is one."""

type JSONObject = dict[str, JSONValue]
"""A JSON object."""
