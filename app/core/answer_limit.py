"""The answer-size limit of the request being served, readable by services.

The HTTP layer sets it (:class:`app.api.http_limits.AnswerLimitMiddleware`); a service
checks an answer against it where the answer is built, before storing anything.
"""

from __future__ import annotations

from contextvars import ContextVar

from app.core.errors import AnswerTooLarge

ANSWER_LIMIT: ContextVar[int | None] = ContextVar("datarax_answer_limit", default=None)
"""The answer limit of the request being served (``DATARAX_MAX_ANSWER_MB`` in bytes), set
by :class:`app.api.http_limits.AnswerLimitMiddleware`; None outside a request."""


def check_answer_size(size: int, what: str = "the answer") -> None:
    """Raises 422 ``answer_too_large`` when an answer of ``size`` bytes would pass the
    request's limit, so a service can refuse it where it is built, before it stores or
    sends anything (the middleware refuses any answer that gets past this anyway).

    Raises:
      AnswerTooLarge: ``size`` is above :data:`ANSWER_LIMIT`.
    """
    limit = ANSWER_LIMIT.get()
    if limit is not None and size > limit:
        raise AnswerTooLarge(
            f"{what} ({size} bytes) would pass the limit of {limit} bytes "
            "(DATARAX_MAX_ANSWER_MB); ask for less (a smaller model or batch, fewer "
            "devices, a page, a summary view)"
        )
