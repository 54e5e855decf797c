"""One type per answer (issue 55, item 5): every JSON answer of the service is one class of
:mod:`datarax.answers`, which the service serialises, its OpenAPI document describes and
the client parses back. Checked:

- every public class of ``datarax/answers`` is a frozen :class:`Answer` dataclass, and no
  TypedDict or pydantic model is left there;
- the client's answer types are those same objects (re-exported, not redefined);
- every 2xx JSON response of the OpenAPI document refers to a schema named after an answer
  class, and no pydantic model of ``app/schemas`` has an answer's name;
- each answer's documented examples parse and serialise back unchanged, and the schema
  pydantic derives for each answer class leaves out its internal fields.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pkgutil
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, TypeAdapter

import datarax.answers
from datarax.answers.base import Answer
from datarax.client import answers as client_answers

ROOT = Path(__file__).resolve().parents[1]

ALIASES = {"ModelSpec", "MetricValue"}
"""Names of ``datarax.answers`` that are type aliases, not classes: values whose shape is
the caller's own (the model object as the request gave it, a reduced metric)."""


def _answer_modules() -> list[Any]:
    return [
        importlib.import_module(f"datarax.answers.{info.name}")
        for info in pkgutil.iter_modules(datarax.answers.__path__)
        if info.name != "base"
    ]


def _answer_classes() -> dict[str, type]:
    found: dict[str, type] = {}
    for module in _answer_modules():
        for name in module.__all__:
            if name in ALIASES:
                continue
            cls = getattr(module, name)
            assert name not in found or found[name] is cls, f"{name} is defined twice"
            found[name] = cls
    return found


ANSWERS = _answer_classes()


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_each_answer_is_a_frozen_answer_dataclass(name: str) -> None:
    cls = ANSWERS[name]
    assert isinstance(cls, type) and issubclass(cls, Answer), name
    assert dataclasses.is_dataclass(cls), name
    assert cls.__dataclass_params__.frozen, name  # type: ignore[attr-defined]
    assert not typing.is_typeddict(cls) and not issubclass(cls, BaseModel), name


def test_the_client_re_exports_the_answer_classes() -> None:
    for name in client_answers.__all__:
        if name in ALIASES:
            continue
        assert getattr(client_answers, name) is ANSWERS[name], name
    tree = ast.parse((ROOT / "datarax/client/answers.py").read_text())
    assert not [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]


def _app_class_names() -> set[str]:
    """The classes of ``app/schemas`` (the service's pydantic models)."""
    names: set[str] = set()
    for path in (ROOT / "app/schemas").rglob("*.py"):
        tree = ast.parse(path.read_text())
        names |= {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    return names


def test_no_class_of_the_service_redefines_an_answer() -> None:
    twins = sorted(_app_class_names() & set(ANSWERS))
    assert not twins, f"app/schemas defines classes named like answers: {twins}"


def test_every_json_answer_of_the_openapi_document_is_an_answer_class(api) -> None:
    doc = api.get("/openapi.json").json()
    refs: dict[str, str] = {}
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            for status, response in operation.get("responses", {}).items():
                if not status.startswith("2"):
                    continue
                schema = response.get("content", {}).get("application/json", {}).get("schema")
                if schema is None:
                    continue
                for ref in _refs(schema):
                    refs[f"{method.upper()} {path} {status}"] = ref
    assert refs, "no JSON answer documented"
    names = {ref.rsplit("/", 1)[-1] for ref in refs.values()}
    assert names <= set(ANSWERS), sorted(names - set(ANSWERS))


def _refs(schema: Any) -> list[str]:
    if isinstance(schema, dict):
        out = [schema["$ref"]] if "$ref" in schema else []
        for value in schema.values():
            out += _refs(value)
        return out
    if isinstance(schema, list):
        return [ref for value in schema for ref in _refs(value)]
    return []


def _examples(cls: type) -> list[dict[str, Any]]:
    config = cls.__dict__.get("__pydantic_config__") or {}
    return list((config.get("json_schema_extra") or {}).get("examples", []))


EXAMPLES = [(name, i) for name in sorted(ANSWERS) for i, _ in enumerate(_examples(ANSWERS[name]))]


@pytest.mark.parametrize(("name", "index"), EXAMPLES)
def test_documented_examples_round_trip(name: str, index: int) -> None:
    cls = ANSWERS[name]
    example = _examples(cls)[index]
    parsed = cls.from_json(example)  # type: ignore[attr-defined]
    assert parsed.to_json() == example
    TypeAdapter(cls).validate_python(example)  # the schema's own reading accepts it


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_the_schema_of_each_answer_is_its_json_members(name: str) -> None:
    cls = ANSWERS[name]
    schema = TypeAdapter(cls).json_schema()
    members = {f.name for f in dataclasses.fields(cls) if not f.metadata.get("answer_internal")}
    assert set(schema["properties"]) == members
    required = set(schema.get("required", ()))
    omitted = {f.name for f in dataclasses.fields(cls) if f.metadata.get("answer_omitted")}
    assert not required & omitted  # a member sent only sometimes is not required
