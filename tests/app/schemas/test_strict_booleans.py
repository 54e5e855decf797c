"""Issue 58, class 11: ``"quick": "yes"`` was read as true. A request is never silently read
as something else: every boolean member of every request model takes JSON ``true`` or
``false`` only (pydantic's lax mode reads "yes", "on", 1 and "1" as true)."""

from __future__ import annotations

import importlib
import pkgutil
import typing

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

import app.schemas


def _models() -> list[type[BaseModel]]:
    found = []
    for info in pkgutil.iter_modules(app.schemas.__path__):
        module = importlib.import_module(f"app.schemas.{info.name}")
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseModel)
                and value.__module__ == module.__name__
            ):
                found.append(value)
    return found


def _boolean_fields() -> list[tuple[str, type[BaseModel], str]]:
    out = []
    for model in _models():
        for name, field in model.model_fields.items():
            arms = typing.get_args(field.annotation) or (field.annotation,)
            bare = {
                typing.get_args(a)[0] if typing.get_origin(a) is typing.Annotated else a
                for a in arms
            }
            if bool in bare:
                out.append((f"{model.__name__}.{name}", model, name))
    return out


FIELDS = _boolean_fields()


def test_the_request_models_have_boolean_members() -> None:
    names = {label for label, _, _ in FIELDS}
    assert {"HostCalibrationRequest.quick", "JobPatchRequest.finished"} <= names, names


@pytest.mark.parametrize(("model", "name"), [f[1:] for f in FIELDS], ids=[f[0] for f in FIELDS])
@pytest.mark.parametrize("value", ["yes", "true", 1, "1", "on"])
def test_every_boolean_member_takes_only_true_or_false(model, name, value) -> None:
    field = model.model_fields[name]
    hint = field.annotation
    adapter = TypeAdapter(typing.Annotated[hint, *field.metadata] if field.metadata else hint)
    assert adapter.validate_python(True) is True
    with pytest.raises(ValidationError):
        adapter.validate_python(value)
