"""The client's answer types: every public method says what it returns, and what it
returns is one of the answer classes of :mod:`datarax.answers` (the service documents and
serialises the same classes: tests/test_answer_types.py)."""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any, get_args, get_origin, get_type_hints

import pytest

from datarax.client import AsyncClient, Client, answers
from datarax.client._clients import _Operation
from datarax.client._core import Call

MAX_ANY = 3
"""Public client methods that may still return ``Any`` (issue 37)."""


def _return_type(cls: type, name: str) -> Any:
    """The answer type of ``cls.name``: an operation's ``Call[T]`` gives ``T`` (the sync
    client returns it, the async client an awaitable of it), a plain method its return
    annotation."""
    member = inspect.getattr_static(cls, name)
    if isinstance(member, _Operation):
        built = get_type_hints(member.build)["return"]
        assert get_origin(built) is Call, f"{name} builds {built}, not a Call[T]"
        return get_args(built)[0]
    return get_type_hints(member)["return"]


def _public_methods(cls: type) -> list[str]:
    def is_method(member: object) -> bool:
        return isinstance(member, _Operation) or inspect.isfunction(member)

    return [
        name
        for name in dir(cls)
        if not name.startswith("_") and is_method(inspect.getattr_static(cls, name))
    ]


@pytest.mark.parametrize("cls", [Client, AsyncClient])
def test_at_most_three_public_methods_return_any(cls: type) -> None:
    names = _public_methods(cls)
    assert len(names) == 32  # 29 operations, pusher, iter_job_metrics, close/aclose
    loose = [name for name in names if _return_type(cls, name) is Any]
    assert len(loose) <= MAX_ANY, loose


def test_every_operation_answers_a_type_of_answers() -> None:
    # The operations answer the types of datarax.client.answers (or None: 204).
    known = {getattr(answers, name) for name in answers.__all__}
    for name in _public_methods(Client):
        member = inspect.getattr_static(Client, name)
        if not isinstance(member, _Operation):
            continue
        answer = _return_type(Client, name)
        if answer is type(None):  # 204: no content
            assert name.startswith("delete_"), name
            continue
        parts = (
            set(get_args(answer))
            if get_origin(answer) in (typing.Union, types.UnionType)
            else {answer}
        )
        assert any(part in known for part in parts), f"{name} answers {answer}"


def test_iter_job_metrics_yields_history_points() -> None:
    for cls in (Client, AsyncClient):
        produced = _return_type(cls, "iter_job_metrics")
        assert get_args(produced) == (answers.HistoryPoint,)


def test_a_union_reads_as_the_answer_its_members_fit_or_as_it_is() -> None:
    # reduce_metrics answers ReduceAnswer | NpzArrays: an npz answer's arrays stay arrays
    # (a helper found it raised TypeError), a JSON answer becomes the class; a memory
    # union takes the richer class only when its members are there.
    import numpy as np

    from datarax.answers.base import decode
    from datarax.client._clients import NpzArrays

    arrays = {"loss": np.zeros(2)}
    assert decode(answers.ReduceAnswer | NpzArrays, arrays) is arrays
    json_answer = {"reduced": {"loss": 1.0}, "num_devices": 2}
    parsed = decode(answers.ReduceAnswer | NpzArrays, json_answer)
    assert isinstance(parsed, answers.ReduceAnswer) and parsed.num_devices == 2
    plain = {"params": 1, "optimizer": 1, "batch": 1, "total": 3}
    memory = decode(answers.MemoryEstimate | answers.MemoryPerDevice, plain)
    assert type(memory) is answers.MemoryPerDevice and memory == plain
