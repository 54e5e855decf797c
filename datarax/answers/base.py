"""The base of every answer type: a frozen dataclass that the service serialises, its
OpenAPI document describes and the client parses back, all from the one definition.

An answer is declared once, as a ``@dataclass(frozen=True, eq=False)`` subclass of
:class:`Answer`, with a docstring under each field (the service's OpenAPI document reads
those as the fields' descriptions: pydantic's ``use_attribute_docstrings``). Three kinds of
field:

- plain fields are always in the JSON, ``null`` where the value is ``None``;
- :func:`omitted` fields (default ``None``) are left out of the JSON while ``None``: the
  members the service sends only sometimes (a hardware plan's ``hardware``);
- :func:`internal` fields are the library's own (a priced step's memory, its parameter
  shardings): never in the JSON nor in the OpenAPI schema; a parsed answer has their
  default.

:meth:`Answer.to_json` gives the JSON object (nested answers as objects, tuples as lists);
:meth:`Answer.from_json` builds the answer from one, nested answers included, ignoring
members it does not know (a newer service's) so a client keeps reading. An answer is also
a read-only ``Mapping`` of the members its JSON has (``plan["id"]``, ``"hardware" in plan``,
``dict(answer)``), for code written when the client returned dicts; attributes are the
typed read.

Nothing here imports pydantic: the service hands these classes to pydantic's
``TypeAdapter`` (through FastAPI's ``response_model`` and ``responses``), which reads
:attr:`Answer.__pydantic_config__` (a plain dict) and
:meth:`Answer.__get_pydantic_json_schema__` (a duck-typed hook) without the library
depending on it.

Example:
  >>> from dataclasses import dataclass
  >>> @dataclass(frozen=True, eq=False)
  ... class Pair(Answer):
  ...     a: int
  ...     b: str | None = omitted()
  >>> Pair(1).to_json(), Pair.from_json({"a": 2, "b": "x", "new": 0}).b
  ({'a': 1}, 'x')
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, Literal, Self, Union, get_args, get_origin

from datarax.json_types import JSONObject

__all__ = ["Answer", "decode", "internal", "omitted"]

_OMITTED = "answer_omitted"
_INTERNAL = "answer_internal"


def omitted() -> Any:
    """A member the JSON carries only when it is not ``None`` (default ``None``)."""
    return dataclasses.field(default=None, metadata={_OMITTED: True})


def internal(default: Any = None, *, default_factory: Any = None) -> Any:
    """A field of the library's own: never in the JSON or the OpenAPI schema."""
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata={_INTERNAL: True})
    return dataclasses.field(default=default, metadata={_INTERNAL: True})


@dataclasses.dataclass(frozen=True)
class _Member:
    name: str
    omitted: bool
    hint: Any


@functools.cache
def _members(cls: type) -> tuple[_Member, ...]:
    """The JSON members of an answer class, in field order (internal fields left out)."""
    hints = typing.get_type_hints(cls)
    return tuple(
        _Member(f.name, bool(f.metadata.get(_OMITTED)), hints[f.name])
        for f in dataclasses.fields(cls)
        if not f.metadata.get(_INTERNAL)
    )


@functools.cache
def _required(cls: type) -> frozenset[str]:
    """The JSON members an answer class cannot do without (no default)."""
    return frozenset(
        f.name
        for f in dataclasses.fields(cls)
        if not f.metadata.get(_INTERNAL)
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    )


def _to_json(value: Any) -> Any:
    if isinstance(value, Answer):
        return value.to_json()
    if isinstance(value, (tuple, list)):
        return [_to_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _to_json(v) for k, v in value.items()}
    return value


class Answer(Mapping[str, Any]):
    """A frozen dataclass the service answers with (see the module docstring). Equal to any
    mapping of the same members, as the dicts it replaces were."""

    __pydantic_config__: ClassVar[dict[str, Any]] = {"use_attribute_docstrings": True}
    """Read by pydantic (the service's OpenAPI document): field docstrings describe fields."""

    def to_json(self) -> JSONObject:
        """The answer as the service sends it: plain JSON values in field order, without
        internal fields and without omitted ones that are ``None``."""
        out: JSONObject = {}
        for member in _members(type(self)):
            value = getattr(self, member.name)
            if value is None and member.omitted:
                continue
            out[member.name] = _to_json(value)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        """The answer of a JSON object: nested answers parsed, unknown members ignored.

        Raises:
          TypeError: ``data`` is not an object, or lacks a member the class requires.
        """
        if not isinstance(data, Mapping):
            raise TypeError(f"{cls.__name__} is a JSON object, not {type(data).__name__}")
        given = {m.name: decode(m.hint, data[m.name]) for m in _members(cls) if m.name in data}
        return cls(**given)

    # ------------------------------------------------------------- the Mapping view

    def _present(self) -> Iterator[str]:
        for member in _members(type(self)):
            if not (member.omitted and getattr(self, member.name) is None):
                yield member.name

    def __getitem__(self, key: str) -> Any:
        for member in _members(type(self)):
            if member.name == key:
                value = getattr(self, key)
                if value is None and member.omitted:
                    break
                return value
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return self._present()

    def __len__(self) -> int:
        return sum(1 for _ in self._present())

    # ------------------------------------------------------------- the OpenAPI schema

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> Any:
        """pydantic's hook: the schema without the internal fields."""
        schema = handler(core_schema)
        target = handler.resolve_ref_schema(schema)
        hidden = [f.name for f in dataclasses.fields(cls) if f.metadata.get(_INTERNAL)]  # type: ignore[arg-type]
        for name in hidden:
            target.get("properties", {}).pop(name, None)
            if name in target.get("required", ()):
                target["required"].remove(name)
        return schema


def decode(hint: Any, value: Any) -> Any:
    """``value`` (decoded JSON) read as the type ``hint``: answers (nested too) built from
    their objects, ``tuple[X, ...]`` and ``list[X]`` of them, ``dict[str, X]`` and
    ``X | None``; anything else is returned as it is."""
    if value is None or hint is Any:
        return value
    if isinstance(hint, type):
        if issubclass(hint, Answer) and dataclasses.is_dataclass(hint):
            return hint.from_json(value)
        return value
    origin = get_origin(hint)
    args = get_args(hint)
    if origin in (Union, types.UnionType):
        answers = [a for a in args if isinstance(a, type) and issubclass(a, Answer)]
        if answers and isinstance(value, Mapping):
            # The first answer class whose required members are all there: a union lists
            # the richer class first (``MemoryEstimate | MemoryPerDevice``).
            for arm in answers:
                if _required(arm) <= value.keys():
                    return arm.from_json(value)
            return answers[-1].from_json(value)
        arms = [a for a in args if a is not type(None)]
        return decode(arms[0], value) if len(arms) == 1 else value
    if origin is tuple and isinstance(value, list):
        item = args[0] if args else Any
        return tuple(decode(item, v) for v in value)
    if origin is list and isinstance(value, list):
        return [decode(args[0], v) for v in value] if args else value
    if origin is dict and isinstance(value, Mapping):
        return {k: decode(args[1], v) for k, v in value.items()} if args else value
    if origin is Literal:
        return value
    return value
