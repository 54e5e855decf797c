"""The answer limit a service checks where it builds an answer (set per request)."""

from __future__ import annotations

import contextvars

import pytest

from app.core.answer_limit import ANSWER_LIMIT, check_answer_size
from app.core.errors import AnswerTooLarge


def test_no_limit_outside_a_request():
    assert ANSWER_LIMIT.get() is None
    check_answer_size(10**15)


def test_an_answer_past_the_limit_is_answer_too_large():
    def inside() -> None:
        ANSWER_LIMIT.set(100)
        check_answer_size(100, "the plan")  # at the limit: fine
        with pytest.raises(AnswerTooLarge) as err:
            check_answer_size(101, "the plan")
        assert err.value.code == "answer_too_large" and err.value.status == 422
        assert str(err.value).startswith("the plan (101 bytes)")
        assert "DATARAX_MAX_ANSWER_MB" in str(err.value)

    contextvars.copy_context().run(inside)  # as a request's own context
    assert ANSWER_LIMIT.get() is None
