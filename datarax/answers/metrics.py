"""Metric reductions.

Transitional: these are the client's TypedDicts, moved here to become
:class:`~datarax.answers.base.Answer` dataclasses (one definition read by the service and
the client)."""

from typing import Any, TypedDict

MetricValue = Any


class ReduceAnswer(TypedDict):
    """``POST /v1/metrics/reduce`` (JSON): each metric reduced over its devices."""

    reduced: dict[str, MetricValue]
    num_devices: int


class DeviceMetrics(TypedDict):
    device: int
    metrics: dict[str, MetricValue]


class CollectAnswer(TypedDict):
    """``POST /v1/metrics/collect``: each device's values."""

    devices: list[DeviceMetrics]


__all__ = ["ReduceAnswer", "DeviceMetrics", "CollectAnswer"]
