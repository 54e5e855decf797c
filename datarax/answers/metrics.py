"""Metric reduction answers: ``POST /v1/metrics/reduce`` and ``POST /v1/metrics/collect``.

JSON has no NaN or infinity: in these answers every non-finite float is ``null``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from datarax.answers.base import Answer, examples

__all__ = ["CollectAnswer", "DeviceMetrics", "MetricValue", "ReduceAnswer"]

MetricValue = Any
"""A reduced or per-device metric value: a number (``null`` where not finite) or a nested
list of them, shaped as the caller's metric."""


@dataclass(frozen=True, eq=False)
class ReduceAnswer(Answer):
    """``POST /v1/metrics/reduce`` (JSON): each metric reduced over its devices."""

    __pydantic_config__: ClassVar[dict[str, Any]] = examples(
        {"reduced": {"loss": 1.0, "per_class": [16, 20]}, "num_devices": 4}
    )

    reduced: dict[str, MetricValue]
    """name -> scalar (for [n_devices] input) or nested list; non-finite values are null"""
    num_devices: int


@dataclass(frozen=True, eq=False)
class DeviceMetrics(Answer):
    """One device's values of every metric."""

    device: int
    """position on the leading (device) axis"""
    metrics: dict[str, MetricValue]


@dataclass(frozen=True, eq=False)
class CollectAnswer(Answer):
    """``POST /v1/metrics/collect``: each device's values."""

    __pydantic_config__: ClassVar[dict[str, Any]] = examples(
        {
            "devices": [
                {"device": 0, "metrics": {"loss": 0.9}},
                {"device": 1, "metrics": {"loss": 1.1}},
            ]
        }
    )

    devices: list[DeviceMetrics]
