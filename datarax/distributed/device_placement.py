"""Explicit device placement, hardware-aware batch sizes and prefetching to devices
(upstream datarax's ``device_placement`` API).

- :func:`place_on_device`, :func:`distribute_batch`: ``jax.device_put`` of a pytree onto
  one device or a sharding (non-array leaves such as strings pass through).
- :func:`get_batch_size_recommendation`: the batch size at which a chip's matmuls stop
  being memory-bound, from its catalog entry (:mod:`datarax.hardware.chips`).
- :func:`prefetch_to_device`: a bounded two-stage background queue (read ahead on the
  host, place on the device) so that host-to-device transfer overlaps compute.

Importing this module never touches devices; the device is looked up on first use.
"""

from __future__ import annotations

import enum
import math
import queue
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding, SingleDeviceSharding

from datarax.hardware.chips import Hardware, get_hardware
from datarax.spmd.global_arrays import global_array_from_host
from datarax.tree_types import PyTree

__all__ = [
    "BatchSizeRecommendation",
    "DevicePlacement",
    "HardwareType",
    "distribute_batch",
    "get_batch_size_recommendation",
    "place_on_device",
    "prefetch_to_device",
]


class HardwareType(enum.Enum):
    """Accelerator families with a batch-size recommendation."""

    TPU_V5E = "tpu_v5e"
    TPU_V5P = "tpu_v5p"
    TPU_V4 = "tpu_v4"
    H200 = "h200"
    H100 = "h100"
    A100 = "a100"
    V100 = "v100"
    CPU = "cpu"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class BatchSizeRecommendation:
    """Batch sizes for one hardware type (global batch per chip).

    Attributes:
      min_batch_size: below this, matmuls run under a quarter of peak compute.
      optimal_batch_size: ``critical_batch_size`` rounded up to a multiple of 64.
      critical_batch_size: peak bf16 FLOP/s divided by memory bytes/s: the batch at
        which a bf16 matmul's arithmetic intensity (about ``B`` FLOPs per byte) reaches
        the chip's roofline (rounded up; upstream's own value where the two differ only
        by rounding: TPU v5e 240, H100 298, see ``_UPSTREAM_CRITICAL``).
      max_memory_batch_size: the largest batch that fits, when known (``None`` here: it
        depends on the model).
      notes: where the numbers come from.
    """

    min_batch_size: int
    optimal_batch_size: int
    critical_batch_size: int
    max_memory_batch_size: int | None = None
    notes: str = ""


# The catalog entry of each chip (datarax.hardware.chips, the one place chip figures
# live). Critical batch size = peak bf16 FLOP/s / HBM bytes/s, the roofline argument of
# "How to Scale Your Model", ch. 1 (https://jax-ml.github.io/scaling-book/roofline/),
# which finds 240 for TPU v5e.
_CATALOG_NAME: dict[HardwareType, str] = {
    HardwareType.TPU_V5E: "tpu-v5e",
    HardwareType.TPU_V5P: "tpu-v5p",
    HardwareType.TPU_V4: "tpu-v4",
    HardwareType.H200: "h200-sxm",
    HardwareType.H100: "h100-sxm",
    HardwareType.A100: "a100-sxm",
    HardwareType.V100: "v100-sxm",
}

_URL = re.compile(r"https://[^\s),;]+")


def _datasheet(entry: Hardware) -> str:
    """The first address the entry cites for its bandwidth or peak (its datasheet)."""
    for figure in ("hbm_bytes_per_s", "peak_bf16_flops"):
        found = _URL.search(entry.sources.get(figure, ""))
        if found:
            return found.group(0)
    return f"datarax.hardware.chips entry {entry.name!r}"


# Where the datasheet ratio and upstream datarax's table (src/datarax/distributed/
# device_placement.py, _BATCH_SIZE_RECOMMENDATIONS) differ only by rounding, upstream's
# critical batch size is kept, so code and tests written for upstream see its numbers:
#   TPU v5e: 197e12 / 819e9 = 240.5; upstream (and the scaling book, with 820 GB/s) 240.
#   H100:    989.5e12 / 3.35e12 = 295.4; upstream 298 (about 1e15 / 3.35e12).
# The datasheet figure stays in the recommendation's notes. Chips whose upstream value is
# a different estimate, not a rounding (v5p 480 vs 166, v4 192 vs 230, A100 240 vs 154,
# V100 96 vs 139), keep the datasheet ratio (docs/UPSTREAM.md).
_UPSTREAM_CRITICAL: dict[HardwareType, int] = {
    HardwareType.TPU_V5E: 240,
    HardwareType.H100: 298,
}

# No datasheet roofline applies to a host CPU or an unknown chip: upstream datarax's
# values for them (src/datarax/distributed/device_placement.py), kept as they are.
_FALLBACK: dict[HardwareType, BatchSizeRecommendation] = {
    HardwareType.CPU: BatchSizeRecommendation(
        1, 32, 16, notes="CPU: memory-bandwidth bound; upstream datarax's defaults."
    ),
    HardwareType.UNKNOWN: BatchSizeRecommendation(
        32, 128, 64, notes="Unknown hardware: upstream datarax's conservative defaults."
    ),
}


def _recommendation(hardware: HardwareType) -> BatchSizeRecommendation:
    if hardware in _FALLBACK:
        return _FALLBACK[hardware]
    entry = get_hardware(_CATALOG_NAME[hardware])
    flops, bandwidth, source = entry.peak_bf16_flops, entry.hbm_bytes_per_s, _datasheet(entry)
    ratio = flops / bandwidth
    critical = _UPSTREAM_CRITICAL.get(hardware, math.ceil(ratio))
    kept = f"; {critical} as upstream datarax" if hardware in _UPSTREAM_CRITICAL else ""
    return BatchSizeRecommendation(
        min_batch_size=max(1, critical // 4),
        optimal_batch_size=math.ceil(critical / 64) * 64,
        critical_batch_size=critical,
        notes=(
            f"{hardware.value}: {flops / 1e12:g} TFLOP/s bf16 / "
            f"{bandwidth / 1e9:g} GB/s = {ratio:.1f}{kept} ({source})"
        ),
    )


def _detect(device: Any) -> HardwareType:
    platform = str(device.platform).lower()
    kind = str(getattr(device, "device_kind", "") or "").lower()
    if platform == "cpu":
        return HardwareType.CPU
    if platform == "tpu":
        if "v5 lite" in kind or "v5e" in kind or "v5litepod" in kind:
            return HardwareType.TPU_V5E
        if "v5p" in kind or kind.strip() == "tpu v5":
            return HardwareType.TPU_V5P
        if "v4" in kind:
            return HardwareType.TPU_V4
        return HardwareType.UNKNOWN
    if platform in ("gpu", "cuda", "rocm"):
        for name, hardware in (
            ("h200", HardwareType.H200),
            ("h100", HardwareType.H100),
            ("a100", HardwareType.A100),
            ("v100", HardwareType.V100),
        ):
            if name in kind:
                return hardware
    return HardwareType.UNKNOWN


def _is_placeable(leaf: Any) -> bool:
    return isinstance(leaf, np.ndarray | jax.Array | np.generic | int | float | complex)


def _put(data: PyTree, sharding: Sharding) -> PyTree:
    """Places every array or number leaf of ``data`` with ``sharding``; others pass."""

    def put(leaf: Any) -> Any:
        if not _is_placeable(leaf):
            return leaf
        return global_array_from_host(leaf, sharding)

    placed: PyTree = jax.tree.map(put, data)
    return placed


class DevicePlacement:
    """Explicit placement onto devices, with the hardware's batch-size recommendation.

    Args:
      default_device: where :meth:`place_on_device` puts data when no device is given;
        default ``jax.devices()[0]``, looked up on first use.

    Example:
      >>> placement = DevicePlacement()
      >>> x = placement.place_on_device(np.ones((4, 8), np.float32))  # doctest: +SKIP
      >>> placement.get_batch_size_recommendation(HardwareType.H100).critical_batch_size
      298
    """

    def __init__(self, default_device: jax.Device | None = None) -> None:
        if default_device is not None and not isinstance(default_device, jax.Device):
            raise TypeError(
                f"default_device must be a jax.Device, got {type(default_device).__name__}; "
                "pass e.g. jax.devices()[0]"
            )
        # Nothing is looked up here (upstream constructs lazily too, and its tests check
        # these two attributes): the first use of default_device/hardware_type fills them.
        self._default_device: jax.Device | None = default_device
        self._hardware_type_cache: HardwareType | None = None

    @property
    def default_device(self) -> jax.Device:
        """The device used when none is given (``jax.devices()[0]`` unless set)."""
        if self._default_device is None:
            self._default_device = jax.devices()[0]
        return self._default_device

    @property
    def hardware_type(self) -> HardwareType:
        """The detected hardware of the default device (platform and ``device_kind``)."""
        if self._hardware_type_cache is None:
            self._hardware_type_cache = _detect(self.default_device)
        return self._hardware_type_cache

    @property
    def num_devices(self) -> int:
        """``jax.device_count()``: all devices of all processes."""
        return jax.device_count()

    def place_on_device(self, data: PyTree, device: jax.Device | None = None) -> PyTree:
        """Copies every array or number leaf of ``data`` to one device.

        Args:
          data: pytree, e.g. ``{"images": [B, H, W, C] float32}``.
          device: target device; default :attr:`default_device`.

        Returns:
          The pytree with ``jax.Array`` leaves on ``device``; strings and ``None`` pass.
        """
        target = self.default_device if device is None else device
        return _put(data, SingleDeviceSharding(target))

    def distribute_batch(self, data: PyTree, sharding: Sharding) -> PyTree:
        """Places every array or number leaf of ``data`` with ``sharding``.

        Args:
          data: pytree, e.g. ``{"images": [B, ...]}``.
          sharding: e.g. ``NamedSharding(mesh, P("data"))``; dimension sizes must divide
            (JAX raises its own ``ValueError`` otherwise).

        Returns:
          The pytree with ``jax.Array`` leaves placed with ``sharding``.
        """
        if not isinstance(sharding, Sharding):
            raise TypeError(
                f"sharding must be a jax.sharding.Sharding, got {type(sharding).__name__}; "
                "pass e.g. NamedSharding(mesh, PartitionSpec('data'))"
            )
        return _put(data, sharding)

    def replicate_across_devices(
        self, data: PyTree, devices: list[jax.Device] | None = None
    ) -> PyTree:
        """A full copy of every leaf on each of ``devices`` (default: all devices)."""
        mesh = Mesh(np.asarray(jax.devices() if devices is None else devices), ("replica",))
        return _put(data, NamedSharding(mesh, PartitionSpec()))

    def shard_batch_dim(
        self, data: PyTree, mesh: Mesh, batch_axis: int = 0, mesh_axis: str = "data"
    ) -> PyTree:
        """Splits dimension ``batch_axis`` of every array leaf over ``mesh_axis``; 0-d
        leaves are replicated.

        Raises:
          ValueError: ``mesh_axis`` is not an axis of ``mesh``.
        """
        if mesh_axis not in mesh.axis_names:
            raise ValueError(
                f"mesh_axis {mesh_axis!r} is not an axis of the mesh {dict(mesh.shape)}; "
                f"pass one of {list(mesh.axis_names)}"
            )

        def put(leaf: Any) -> Any:
            if not isinstance(leaf, np.ndarray | jax.Array):
                return leaf
            spec: list[str | None] = [None] * leaf.ndim
            if batch_axis < leaf.ndim:
                spec[batch_axis] = mesh_axis
            return global_array_from_host(leaf, NamedSharding(mesh, PartitionSpec(*spec)))

        placed: PyTree = jax.tree.map(put, data)
        return placed

    def prefetch_to_device(
        self,
        data_iterator: Iterable[PyTree],
        device: jax.Device | Sharding | None = None,
        buffer_size: int = 2,
        cpu_buffer_size: int | None = None,
    ) -> Iterator[PyTree]:
        """See :func:`prefetch_to_device` (``buffer_size`` is its ``size``)."""
        target = self.default_device if device is None else device
        return DevicePrefetcher(data_iterator, target, buffer_size, cpu_buffer_size)

    def get_batch_size_recommendation(
        self, hardware_type: HardwareType | None = None
    ) -> BatchSizeRecommendation:
        """The recommendation for ``hardware_type`` (default: the detected hardware)."""
        hardware = self.hardware_type if hardware_type is None else hardware_type
        if not isinstance(hardware, HardwareType):
            raise TypeError(
                f"hardware_type must be a HardwareType, got {hardware!r}; "
                f"use one of {[h.name for h in HardwareType]}"
            )
        return _recommendation(hardware)

    def validate_batch_size(
        self, batch_size: int, warn_suboptimal: bool = True
    ) -> tuple[bool, str]:
        """``(ok, message)`` for ``batch_size`` on the detected hardware: not ok below
        ``min_batch_size``; a suggestion below ``critical_batch_size`` when
        ``warn_suboptimal``."""
        rec = self.get_batch_size_recommendation()
        name = self.hardware_type.value
        if batch_size < rec.min_batch_size:
            return False, (
                f"Batch size {batch_size} is below the minimum {rec.min_batch_size} for "
                f"{name}; use at least {rec.min_batch_size}."
            )
        if batch_size < rec.critical_batch_size and warn_suboptimal:
            return True, (
                f"Batch size {batch_size} is below the critical size "
                f"{rec.critical_batch_size} for {name}; matmuls stay memory-bound."
            )
        if batch_size >= rec.optimal_batch_size:
            return True, f"Batch size {batch_size} is optimal for {name}."
        return True, f"Batch size {batch_size} is acceptable for {name}."

    def get_device_info(self) -> dict[str, Any]:
        """Device count, detected hardware, platforms, kinds and each device's id."""
        devices = jax.devices()
        return {
            "num_devices": len(devices),
            "hardware_type": self.hardware_type.value,
            "platforms": sorted({d.platform for d in devices}),
            "device_kinds": sorted({str(d.device_kind) for d in devices}),
            "devices": [
                {"id": d.id, "platform": d.platform, "device_kind": str(d.device_kind)}
                for d in devices
            ],
        }


def place_on_device(data: PyTree, device: jax.Device | None = None) -> PyTree:
    """Copies every array or number leaf of ``data`` to ``device`` (default: the first
    device); see :meth:`DevicePlacement.place_on_device`."""
    return DevicePlacement(device).place_on_device(data, device)


def distribute_batch(data: PyTree, sharding: Sharding) -> PyTree:
    """Places every array or number leaf of ``data`` with ``sharding``; see
    :meth:`DevicePlacement.distribute_batch`."""
    return DevicePlacement().distribute_batch(data, sharding)


def get_batch_size_recommendation(
    hardware_type: HardwareType | None = None,
) -> BatchSizeRecommendation:
    """The batch-size recommendation for ``hardware_type`` or the detected hardware.

    Example:
      >>> get_batch_size_recommendation(HardwareType.TPU_V5E).critical_batch_size
      240
    """
    return DevicePlacement().get_batch_size_recommendation(hardware_type)


def prefetch_to_device(
    data_iterator: Iterable[PyTree],
    size: int = 2,
    device: jax.Device | Sharding | None = None,
    cpu_buffer_size: int | None = None,
) -> Iterator[PyTree]:
    """Yields the items of ``data_iterator`` already on the device, placed in the
    background while the caller computes on earlier ones.

    Two stages, each a thread and a bounded queue: a reader pulls items from
    ``data_iterator`` into a host queue of ``cpu_buffer_size`` items, and a placer copies
    them to ``device`` (``jax.device_put``, waiting until the copy is done) into a device
    queue of ``size`` items. At most ``size + cpu_buffer_size + 2`` items are taken from
    ``data_iterator`` ahead of the caller. Order is kept; an exception raised by
    ``data_iterator`` (or by placement) is raised by ``next()`` at its position. Closing
    the iterator (``close()``, ``with``, or leaving a ``for`` loop and dropping it) stops
    both threads.

    Args:
      data_iterator: iterable of pytrees, e.g. ``{"inputs": [B, F] float32}`` batches.
      size: device-side buffer, in items (>= 1).
      device: a ``jax.Device`` (default: the first device) or a ``Sharding`` (e.g.
        ``NamedSharding(mesh, P("data"))`` to split each batch over devices).
      cpu_buffer_size: host-side read-ahead, in items (>= 1); default ``2 * size``.

    Returns:
      A :class:`DevicePrefetcher`: an iterator of placed pytrees (``jax.Array`` leaves;
      strings and ``None`` pass through).

    Raises:
      ValueError: ``size`` or ``cpu_buffer_size`` below 1.
    """
    target = DevicePlacement().default_device if device is None else device
    return DevicePrefetcher(data_iterator, target, size, cpu_buffer_size)


_END = object()


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


class DevicePrefetcher(Iterator[PyTree]):
    """The iterator :func:`prefetch_to_device` returns.

    Attributes:
      pulled: items taken from the source so far.
      placed: items copied to the device so far (each waited on until ready).
    """

    def __init__(
        self,
        source: Iterable[PyTree],
        device: jax.Device | Sharding,
        size: int = 2,
        cpu_buffer_size: int | None = None,
    ):
        cpu = 2 * size if cpu_buffer_size is None else cpu_buffer_size
        for name, value in (("size", size), ("cpu_buffer_size", cpu)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if isinstance(device, Sharding):
            self._sharding: Sharding = device
        elif isinstance(device, jax.Device):
            self._sharding = SingleDeviceSharding(device)
        else:
            raise TypeError(
                f"device must be a jax.Device or a Sharding, got {type(device).__name__}"
            )
        self._source = iter(source)
        self._host: queue.Queue[Any] = queue.Queue(maxsize=cpu)
        self._device: queue.Queue[Any] = queue.Queue(maxsize=size)
        self._stop = threading.Event()
        self._done = False
        self.pulled = 0
        self.placed = 0
        self._reader = threading.Thread(target=self._read, name="prefetch-read", daemon=True)
        self._placer = threading.Thread(target=self._place, name="prefetch-place", daemon=True)
        self._reader.start()
        self._placer.start()

    def _offer(self, q: queue.Queue[Any], item: Any) -> bool:
        """Puts ``item`` unless stopped first; returns whether it was put."""
        while not self._stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _take(self, q: queue.Queue[Any]) -> Any:
        while not self._stop.is_set():
            try:
                return q.get(timeout=0.05)
            except queue.Empty:
                continue
        return _END

    def _read(self) -> None:
        try:
            for item in self._source:
                self.pulled += 1
                if not self._offer(self._host, item):
                    return
        except BaseException as err:  # noqa: BLE001 - handed to the consumer, in order
            self._offer(self._host, _Failure(err))
            return
        self._offer(self._host, _END)

    def _place(self) -> None:
        while True:
            item = self._take(self._host)
            if item is _END or isinstance(item, _Failure):
                self._offer(self._device, item)
                return
            try:
                placed = jax.block_until_ready(_put(item, self._sharding))
            except BaseException as err:  # noqa: BLE001 - handed to the consumer, in order
                self._offer(self._device, _Failure(err))
                return
            self.placed += 1
            if not self._offer(self._device, placed):
                return

    def __iter__(self) -> DevicePrefetcher:
        return self

    def __next__(self) -> PyTree:
        if self._done:
            raise StopIteration
        item = self._device.get()
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.error
        placed: PyTree = item
        return placed

    def close(self) -> None:
        """Stops both threads and drops what they hold; later ``next()`` stops."""
        self._done = True
        self._stop.set()
        for thread in (self._reader, self._placer):
            if thread is not threading.current_thread():
                thread.join(timeout=5)

    def __enter__(self) -> DevicePrefetcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)  # absent when __init__ rejected its arguments
        if stop is not None:
            stop.set()
