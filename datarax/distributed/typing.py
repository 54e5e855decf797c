"""Upstream datarax's path to the library's type aliases, which :mod:`datarax.tree_types`
defines (below every package that uses them): the same objects, re-exported, so
``from datarax.distributed.typing import PyTree`` keeps working."""

from __future__ import annotations

from datarax.tree_types import (
    GradientReduction,
    MetricOp,
    NamedLeaves,
    NanPolicy,
    PyTree,
    PyTreeLeaf,
    ReduceOp,
    Scalar,
)

__all__ = [
    "GradientReduction",
    "MetricOp",
    "NamedLeaves",
    "NanPolicy",
    "PyTree",
    "PyTreeLeaf",
    "ReduceOp",
    "Scalar",
]
