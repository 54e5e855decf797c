"""Device meshes: data, model, hybrid and arbitrary named meshes.

Axis types: every mesh made here uses ``AxisType.Auto`` on all axes. ``jax.make_mesh``
now defaults to ``Explicit``, under which a matmul contracting a ``'model'``-sharded
dimension raises ``ShardingTypeError`` unless the caller passes ``out_sharding``. The
guide's examples call plain NNX models on sharded data and expect XLA to insert the
collectives, which is what ``Auto`` does (losses equal one device to float tolerance).
Pass ``axis_types`` to :meth:`DeviceMeshManager.create_device_mesh` for Explicit meshes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from datarax.plan.layout import AxesLike, resolve_axes


class DeviceMeshManager:
    """Creates and describes JAX device meshes. Static methods only; no instance needed."""

    @staticmethod
    def create_device_mesh(
        mesh_shape: AxesLike,
        devices: Sequence[jax.Device] | None = None,
        axis_types: Sequence[AxisType] | None = None,
    ) -> Mesh:
        """Builds a mesh over the first ``prod(mesh_shape)`` devices in JAX's mesh order.

        Args:
          mesh_shape: ordered axis sizes, a dict ``{"data": 2, "model": 4}`` or a list of
            ``(name, size)`` pairs. One size may be ``-1``: it takes what the devices leave.
          devices: devices to use (default: all global devices, ``jax.devices()``).
          axis_types: per-axis ``AxisType``; default ``Auto`` on every axis (see module doc).

        Returns:
          A ``jax.sharding.Mesh`` with the given axis names, in the given order.

        Raises:
          ValueError: a bad axis name or size, several ``-1`` axes, or more devices
            needed than exist (the message names both numbers).

        Example:
          >>> mesh = DeviceMeshManager.create_device_mesh({"data": -1, "model": 2})
        """
        devices = list(jax.devices() if devices is None else devices)
        axes = resolve_axes(mesh_shape, len(devices), exact=False)
        names = tuple(axes)
        sizes = tuple(axes.values())
        types = tuple(axis_types) if axis_types is not None else (AxisType.Auto,) * len(names)
        if len(types) != len(names):
            raise ValueError(f"axis_types has {len(types)} entries for {len(names)} axes {names}")
        return jax.make_mesh(sizes, names, axis_types=types, devices=devices[: int(np.prod(sizes))])

    @staticmethod
    def create_data_parallel_mesh(num_devices: int | None = None) -> Mesh:
        """A 1-D ``('data',)`` mesh over ``num_devices`` devices (default: all)."""
        return DeviceMeshManager.create_device_mesh(
            {"data": -1 if num_devices is None else num_devices}
        )

    @staticmethod
    def create_model_parallel_mesh(num_devices: int) -> Mesh:
        """A 1-D ``('model',)`` mesh over the first ``num_devices`` devices."""
        return DeviceMeshManager.create_device_mesh({"model": num_devices})

    @staticmethod
    def create_hybrid_mesh(data_parallel_size: int, model_parallel_size: int) -> Mesh:
        """A 2-D ``('data', 'model')`` mesh of ``data_parallel_size x model_parallel_size``."""
        return DeviceMeshManager.create_device_mesh(
            {"data": data_parallel_size, "model": model_parallel_size}
        )

    @staticmethod
    def get_mesh_info(mesh: Mesh) -> dict[str, Any]:
        """Describes a mesh as plain JSON-able values.

        Returns:
          ``total_devices``, ``axes`` {name: size}, ``axis_names``, ``shape``,
          ``axis_types``, ``device_ids`` (nested lists in mesh order), ``platform``,
          ``process_count`` (processes owning devices of this mesh) and
          ``process_indices``.
        """
        flat = list(mesh.devices.flat)
        ids = np.vectorize(lambda d: d.id, otypes=[np.int64])(mesh.devices)
        processes = sorted({d.process_index for d in flat})
        return {
            "total_devices": len(flat),
            "axes": {name: int(size) for name, size in mesh.shape.items()},
            "axis_names": list(mesh.axis_names),
            "shape": [int(s) for s in mesh.devices.shape],
            "axis_types": [str(t).split(".")[-1] for t in mesh.axis_types],
            "device_ids": ids.tolist(),
            "platform": flat[0].platform,
            "process_count": len(processes),
            "process_indices": processes,
        }
