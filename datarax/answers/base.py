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

import ast
import dataclasses
import functools
import inspect
import itertools
import textwrap
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, Literal, Self, Union, get_args, get_origin

from datarax.json_types import JSONObject

__all__ = ["Answer", "decode", "examples", "internal", "omitted"]

_OMITTED = "answer_omitted"
_INTERNAL = "answer_internal"


def omitted() -> Any:
    """A member the JSON carries only when it is not ``None`` (default ``None``)."""
    return dataclasses.field(default=None, metadata={_OMITTED: True})


def examples(*documented: dict[str, Any]) -> dict[str, Any]:
    """An answer class's ``__pydantic_config__`` with its documented examples (the OpenAPI
    schema shows them; tests/test_answer_types.py round-trips each)."""
    return {**Answer.__pydantic_config__, "json_schema_extra": {"examples": list(documented)}}


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
    plain: bool
    """The hint holds only JSON scalars, lists and string-keyed dicts of them: a value of
    it is its own JSON (nothing to build on reading, nothing to convert on writing)."""


_SCALARS = (int, float, str, bool, type(None))


def _is_plain(hint: Any) -> bool:
    if hint in _SCALARS:
        return True
    origin = get_origin(hint)
    args = get_args(hint)
    if origin in (Union, types.UnionType, Literal):
        return origin is Literal or all(_is_plain(a) for a in args)
    if origin is list:
        return bool(args) and _is_plain(args[0])
    if origin is dict:
        return len(args) == 2 and args[0] is str and _is_plain(args[1])
    return False


@functools.cache
def _members(cls: type) -> tuple[_Member, ...]:
    """The JSON members of an answer class, in field order (internal fields left out)."""
    hints = typing.get_type_hints(cls)
    return tuple(
        _Member(f.name, bool(f.metadata.get(_OMITTED)), hints[f.name], _is_plain(hints[f.name]))
        for f in dataclasses.fields(cls)
        if not f.metadata.get(_INTERNAL)
    )


_PLAIN_VALUES = (int, float, str, bool, type(None), list, dict)


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
    mapping with the same JSON (tuples read as lists), as the dicts it replaces were."""

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
            # A plain member's list or dict is JSON already (a tuple or a read-only
            # mapping given for it is still converted).
            plain = member.plain and type(value) in _PLAIN_VALUES
            out[member.name] = value if plain else _to_json(value)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        """The answer of a JSON object: nested answers parsed, unknown members ignored.

        Raises:
          TypeError: ``data`` is not an object, or lacks a member the class requires.
        """
        if not isinstance(data, Mapping):
            raise TypeError(f"{cls.__name__} is a JSON object, not {type(data).__name__}")
        known, readers, build = _reading(cls)
        given = {name: value for name, value in data.items() if name in known}
        for name, read in readers:
            value = given.get(name)
            if value is not None:
                given[name] = read(value)
        if build is None:
            return cls(**given)
        defaults, factories, required = build
        if not required <= given.keys():
            missing = ", ".join(sorted(required - given.keys()))
            raise TypeError(f"{cls.__name__} lacks the member(s) {missing}")
        # The fields set as the dataclass's __init__ would (a frozen __init__ sets each
        # through object.__setattr__: several times slower over a history page's rows).
        answer = object.__new__(cls)
        fields = answer.__dict__
        fields.update(defaults)
        for name, factory in factories:
            fields[name] = factory()
        fields.update(given)
        return answer

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

    def __eq__(self, other: object) -> bool:
        # Not Mapping's: it calls self.items(), which a list answer's ``items`` field hides.
        if not isinstance(other, Mapping):
            return NotImplemented
        # Compared as JSON: a tuple member equals the list the JSON has.
        theirs = other.to_json() if isinstance(other, Answer) else _to_json(dict(other))
        return bool(self.to_json() == theirs)

    __hash__ = None  # type: ignore[assignment]

    # ------------------------------------------------------------- the OpenAPI schema

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> Any:
        """pydantic's hook: the schema without the internal fields."""
        schema = handler(core_schema)
        target = handler.resolve_ref_schema(schema)
        # pydantic reads the docstrings of a class's own fields only: an inherited
        # member (a MeshPlan's summary members) takes its description from its class.
        properties = target.get("properties", {})
        for base in cls.__mro__[1:]:
            if base is not Answer and issubclass(base, Answer):
                for name, doc in _field_docstrings(base).items():
                    if name in properties:
                        properties[name].setdefault("description", doc)
        hidden = [f.name for f in dataclasses.fields(cls) if f.metadata.get(_INTERNAL)]  # type: ignore[arg-type]
        # Omitted members are never required, even where the class's config asks the
        # serialisation schema to require members with defaults.
        omitted = [f.name for f in dataclasses.fields(cls) if f.metadata.get(_OMITTED)]  # type: ignore[arg-type]
        for name in hidden:
            target.get("properties", {}).pop(name, None)
        required = target.get("required")
        if required is not None:
            target["required"] = [n for n in required if n not in hidden and n not in omitted]
            if not target["required"]:
                del target["required"]
        return schema


@functools.cache
def _builder(
    cls: type,
) -> tuple[Mapping[str, object], tuple[tuple[str, Any], ...], frozenset[str]] | None:
    """How :meth:`Answer.from_json` fills an instance without calling ``__init__``: the
    fields' defaults, their default factories and the names with neither; ``None`` for a
    class whose ``__init__`` does more (a ``__post_init__``, ``init=False`` fields)."""
    fields = dataclasses.fields(cls)
    if hasattr(cls, "__post_init__") or not all(f.init for f in fields):
        return None
    defaults = {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
    factories = tuple(
        (f.name, f.default_factory) for f in fields if f.default_factory is not dataclasses.MISSING
    )
    required = frozenset(f.name for f in fields) - defaults.keys() - {n for n, _ in factories}
    return defaults, factories, required


@functools.cache
def _reading(cls: type) -> tuple[frozenset[str], tuple[tuple[str, Any], ...], Any]:
    """What :meth:`Answer.from_json` needs of a class, worked out once: its JSON members'
    names, (name, reader) of those whose JSON is not their value as it is
    (:func:`_reader`), and :func:`_builder`'s plan."""
    members = _members(cls)
    readers = tuple((m.name, read) for m in members if (read := _reader(m.hint)) is not None)
    return frozenset(m.name for m in members), readers, _builder(cls)


def _each(item: Any, kind: type) -> Any:
    return lambda v: kind(x if x is None else item(x) for x in v)


@functools.cache
def _reader(hint: Any) -> Any:
    """What :func:`decode` does for ``hint``, decided once per type: ``None`` where any
    JSON value is its own reading (``int``, ``list[str]``, ``dict[str, Any]``, ...), else
    a function of the (non-null) value."""
    if hint is Any or hint in _SCALARS:
        return None
    if isinstance(hint, type):
        return hint.from_json if issubclass(hint, Answer) else None
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        if any(isinstance(a, type) and issubclass(a, Answer) for a in args):
            return functools.partial(_union, args)
        arms = [a for a in args if a is not type(None)]
        return _reader(arms[0]) if len(arms) == 1 else None
    item = _reader(args[0]) if args and origin in (tuple, list, Sequence) else None
    if origin is tuple:
        return tuple if item is None else _each(item, tuple)
    if origin in (list, Sequence):
        return None if item is None else _each(item, list)
    if origin is dict and len(args) == 2:
        value = _reader(args[1])
        if value is None:
            return None
        return lambda v: {k: x if x is None else value(x) for k, x in v.items()}
    return None


def _field_docstrings(cls: type) -> dict[str, str]:
    """The docstrings under ``cls``'s own fields, as pydantic reads them ({} where the
    source is not at hand)."""
    try:
        source = inspect.getsource(cls)
    except OSError:
        return {}
    body = ast.parse(textwrap.dedent(source)).body[0]
    assert isinstance(body, ast.ClassDef)
    docs = {}
    for node, after in itertools.pairwise(body.body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def decode(hint: Any, value: Any) -> Any:
    """``value`` (decoded JSON) read as the type ``hint``: answers (nested too) built from
    their objects, ``tuple[X, ...]`` and ``list[X]`` of them, ``dict[str, X]`` and
    ``X | None``; anything else is returned as it is (:func:`_reader`)."""
    read = _reader(hint)
    return value if read is None or value is None else read(value)


def _union(arms: tuple[Any, ...], value: Any) -> Any:
    """A union's reading: the first answer class whose required members are all there (a
    union lists the richer class first: ``MemoryEstimate | MemoryPerDevice``)."""
    answers = [a for a in arms if isinstance(a, type) and issubclass(a, Answer)]
    if not isinstance(value, Mapping):
        return value
    for arm in answers:
        if _required(arm) <= value.keys():
            return arm.from_json(value)
    if len(answers) < len([a for a in arms if a is not type(None)]):
        return value  # another arm's (an npz answer: ``ReduceAnswer | NpzArrays``)
    return answers[-1].from_json(value)
