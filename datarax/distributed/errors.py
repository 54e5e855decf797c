"""The library's error types under their ``datarax.distributed`` name: they live in
:mod:`datarax.errors`, below every package, and are the same classes here."""

from datarax.errors import MetricsError, PlanError, UnboundAxisError

__all__ = ["MetricsError", "PlanError", "UnboundAxisError"]
