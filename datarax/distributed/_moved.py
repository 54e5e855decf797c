"""The modules that lived in ``datarax.distributed`` before the library was split into
packages by concern, and where each lives now.

``import datarax.distributed.cost`` (or ``from datarax.distributed.planning import
PlanError``) still works: a finder on ``sys.meta_path`` answers the old name with the new
module itself, so both names are one module object and patching either patches both.
New code imports the new path; the old names are kept so code written before the split
runs unchanged.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence

MOVED: dict[str, str] = {
    "axis_roles": "datarax.parallel.axis_roles",
    "param_sharding": "datarax.plan.param_sharding",
    "planning": "datarax.plan.layout",
    "memory": "datarax.plan.memory",
    "hardware_entry": "datarax.hardware.entry",
    "hardware_catalog": "datarax.hardware.catalog",
    "hardware": "datarax.hardware.chips",
    "topology": "datarax.hardware.topology",
    "tpu_slices": "datarax.hardware.tpu_slices",
    "model_specs": "datarax.specs.model_specs",
    "named_models": "datarax.specs.named_models",
    "step_memory": "datarax.estimate.memory",
    "step_time": "datarax.estimate.step_time",
    "cost": "datarax.estimate.cost",
    "recommend": "datarax.estimate.recommend",
    "launch": "datarax.launch.config",
    "launch_maxtext": "datarax.launch.maxtext",
    "maxtext_config": "datarax.launch.maxtext_config",
    "maxtext_plan_request": "datarax.launch.maxtext_plan_request",
    "launch_k8s": "datarax.launch.k8s",
    "launch_slurm": "datarax.launch.slurm",
    "reductions": "datarax.metrics.reductions",
    "_numpy_kernels": "datarax.metrics._numpy_kernels",
    "_reduce_kernels": "datarax.metrics._reduce_kernels",
    "_exact_reductions": "datarax.metrics._exact_reductions",
    "merge": "datarax.metrics.merge",
    "collectives": "datarax.spmd.collectives",
    "train_step": "datarax.spmd.train_step",
    "compile_step": "datarax.spmd.compile_step",
    "multihost": "datarax.spmd.multihost",
    "global_arrays": "datarax.spmd.global_arrays",
}
"""Old submodule of ``datarax.distributed`` -> the module that holds its code now."""

_PREFIX = "datarax.distributed."


class _MovedLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self._target = target
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:  # noqa: ARG002
        module = importlib.import_module(self._target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """The module ran under its new name already; importlib gave it the old name's
        spec, so its own comes back (``__name__`` was never touched)."""
        module.__spec__ = self._spec


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Answers ``datarax.distributed.<old>`` with the module now at ``MOVED[old]``."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,  # noqa: ARG002
        target: types.ModuleType | None = None,  # noqa: ARG002
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(_PREFIX):
            return None
        new = MOVED.get(fullname[len(_PREFIX) :])
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedLoader(new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once per interpreter."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
