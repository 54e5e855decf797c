"""The library's error types, in a module that imports neither JAX nor NumPy.

The service's HTTP process turns these into problem answers; importing them from here
keeps JAX out of that process. It sits below every package of the library (it imports
nothing of it); ``datarax.distributed.errors`` re-exports it for upstream's import path.
:mod:`datarax.plan.layout` and
:mod:`datarax.distributed.metrics` raise them and export the same classes.
"""

from __future__ import annotations

from typing import Any


class PlanError(ValueError):
    """A plan that cannot work.

    Attributes:
      code: snake_case machine-readable reason, one of ``invalid_axis_name``,
        ``invalid_axis_size``, ``invalid_device_count``, ``multiple_auto_axes``,
        ``axes_product_mismatch``, ``not_enough_devices``, ``batch_not_divisible``,
        ``unknown_batch_axis``, ``invalid_batch_shape``, ``duplicate_batch_axis``.
      message: the human-readable explanation; ``str(error) == error.message``.
      http_message: the message less ``library_hint``: what the HTTP service answers.
      library_hint: a sentence for Python callers only (a keyword argument the HTTP API
        does not take), appended to ``message``.
    """

    def __init__(self, code: str, message: str, *, library_hint: str = ""):
        super().__init__(message + library_hint)
        self.code = code
        self.message = message + library_hint
        # what the HTTP service answers: without a hint about the Python API (a keyword
        # argument the HTTP API does not take)
        self.http_message = message
        self.library_hint = library_hint

    def __reduce__(self) -> tuple[Any, ...]:
        # The default reduce would call PlanError(message) and lose the code.
        return (_plan_error, (type(self), self.code, self.http_message, self.library_hint))


def _plan_error(cls: type[PlanError], code: str, message: str, hint: str) -> PlanError:
    return cls(code, message, library_hint=hint)


class MetricsError(ValueError):
    """A metrics reduction could not run; ``code`` says why, in snake_case.

    Codes: ``unknown_reduce_op``, ``unknown_nan_policy``, ``non_finite_values``,
    ``weights_mismatch``, ``invalid_weights``, ``device_count_mismatch``,
    ``empty_metrics``, ``unknown_metric``, ``ragged_array`` (a list metric that is not
    rectangular), ``integer_overflow`` (an integer sum whose exact value does not fit the
    result's dtype), ``nan_policy_traced`` (``nan_policy="raise"`` on a traced floating
    value) and ``unbound_axis_name`` (a collective outside ``pmap``/``shard_map``).

    Attributes:
      code: machine-readable reason, e.g. ``"weights_mismatch"``.
      message: human-readable text naming the value received and the fix.
    """

    def __init__(self, code: str, message: str, *, library_hint: str = ""):
        super().__init__(message + library_hint)
        self.code = code
        self.message = message + library_hint
        self.http_message = message  # what the HTTP service answers (no Python-only hint)

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


class UnboundAxisError(MetricsError, NameError):
    """A collective called outside a context binding its ``axis_name`` (code
    ``unbound_axis_name``). Also a ``NameError``, the type JAX (and so upstream datarax)
    raises there, so ``except NameError`` written for upstream keeps working."""
