"""What a compile check with ``"program": "maxtext"`` compiles (DESIGN v1.4, "The program
users launch"), and the key its result is cached under.

MaxText's own training step, from the ``maxtext`` package, compiled ahead of time through
libtpu for the plan's TPU topology with exactly the configuration that
``POST /v1/meshes/{id}/launch`` (target ``maxtext``) writes for the plan: its ``args``
(``key=value``) and its ``LIBTPU_INIT_ARGS`` (the launch's XLA flags are part of the
program). The check's ``model``, ``batch_shape`` (default: the plan's) and ``optimizer``
(when sent; else the launch's, which names none: MaxText's ``adamw``) stand in the plan's
place, so the configuration is the launch's of the plan planned with them. To those the
check adds only ``compile_topology`` (MaxText's name of the plan's topology, e.g.
``v5e-4`` for ``v5e:2x2``: :func:`compile_topology`) and ``compile_topology_num_slices``.

MaxText runs in its own environment, apart from the service's: the packages its compile
path imports, pinned in ``requirements-maxtext.txt`` and installed ``--no-deps`` into
``.venv/maxtext`` by ``make maxtext`` (which ``make run`` and ``make test`` run), found at
:func:`maxtext_site` and put on the compile's ``PYTHONPATH`` over the service's own JAX,
libtpu and flax. The compile itself runs in a process of its own per check
(:mod:`app.services.compile_checks.maxtext_runner`, :mod:`app.compiler.maxtext`).

Refused with 422 ``compile_target_unavailable`` (carrying the plan's memory estimate where
there is one): plans that are not of TPU hardware (GPU hardware, live and abstract plans:
MaxText's AOT path here compiles TPU topologies only), a topology MaxText has no name for,
and a host without the MaxText environment or without libtpu.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from app.core.errors import CompileTargetUnavailable, ServiceError, from_library
from app.core.settings import Settings
from app.schemas.base import optimizer_name, shards_over_data
from app.schemas.compile_checks import CompileCheckRequest
from app.services.compile_checks.targets import _estimate, _version, compiler_versions
from app.workers.supervisor import PROJECT_ROOT
from datarax.answers.launch import MaxTextLaunch
from datarax.errors import PlanError
from datarax.hardware.chips import get_hardware
from datarax.hardware.tpu_slices import parse_tpu_topology
from datarax.launch.config import launch_config, plan_summary
from datarax.specs.model_specs import model_spec

__all__ = [
    "DRIVER_VERSION",
    "MAXTEXT_SITE_ENV",
    "compile_topology",
    "installed_packages",
    "maxtext_cache_key",
    "maxtext_site",
    "maxtext_target",
]

MAXTEXT_SITE_ENV = "DATARAX_MAXTEXT_SITE"
"""Where MaxText's environment is, when not ``.venv/maxtext`` under the project root."""

DRIVER_VERSION = 1
"""Bumped when :mod:`app.compiler.maxtext` builds or reads the program differently, so
cached results of the old driver are not answered."""

LAUNCH_ENV = ("LIBTPU_INIT_ARGS", "XLA_FLAGS")
"""The launch's variables that change the compiled program (the rest, ``DATARAX_*``,
link the job to its plan)."""

_INSTALL_HINT = (
    "install it with `make maxtext` (`make run` and `make test` do: the packages of "
    "requirements-maxtext.txt, --no-deps, into .venv/maxtext), or point "
    f"{MAXTEXT_SITE_ENV} at such a folder"
)
_SPEC = re.compile(r'"([\w.-]+)":\s*SystemCharacteristics\(\s*"tpu",\s*"([\w.:-]+)"')
_SPEC_FILE = Path("maxtext") / "utils" / "accelerator_to_spec_map.py"


def maxtext_site() -> Path:
    """The folder holding MaxText's environment (``DATARAX_MAXTEXT_SITE``, else
    ``.venv/maxtext`` under the project root)."""
    named = os.environ.get(MAXTEXT_SITE_ENV)
    return Path(named) if named else PROJECT_ROOT / ".venv" / "maxtext"


def installed_packages(site: Path) -> dict[str, str]:
    """``{name: version}`` of the distributions installed in ``site`` (read from their
    ``*.dist-info`` folders, nothing imported); empty where there is none."""
    try:
        entries = sorted(os.listdir(site))
    except OSError:
        return {}
    out = {}
    for entry in entries:
        if entry.endswith(".dist-info") and "-" in entry:
            name, version = entry.removesuffix(".dist-info").rsplit("-", 1)
            out[name.lower().replace("_", "-")] = version
    return out


def maxtext_topologies(site: Path) -> dict[str, str]:
    """MaxText's TPU names and the topology each stands for (``{"v5e-4": "v5e:2x2"}``),
    read from its ``accelerator_to_spec_map.py`` (``compile_topology`` takes these
    names)."""
    try:
        text = (site / _SPEC_FILE).read_text()
    except OSError:
        return {}
    return dict(_SPEC.findall(text))


def _dims(topology: str) -> tuple[int, ...]:
    dims = [int(d) for d in topology.split(":", 1)[-1].split("x")]
    return tuple(dims + [1] * (3 - len(dims)))


def compile_topology(site: Path, hardware: str, topology: str) -> str:
    """MaxText's name (``compile_topology``) of a plan's TPU topology: the entry of its
    generation whose chips per axis are the plan's (``tpu-v5e``, ``v5e:2x2`` ->
    ``v5e-4``; ``tpu-v5p``, ``v5p:2x2x1`` -> ``v5p-8``, MaxText counting v5p in cores).

    Raises:
      CompileTargetUnavailable: MaxText has no name for that shape.
      ServiceError: the library's codes for a topology it does not know.
    """
    try:
        entry, dims = parse_tpu_topology(topology, hardware)
    except PlanError as error:
        raise from_library(error) from None
    prefix = entry.name.removeprefix("tpu-")
    known = {
        name: shape
        for name, shape in maxtext_topologies(site).items()
        if name.rsplit("-", 1)[0] == prefix
    }
    for name, shape in known.items():
        if _dims(shape) == tuple(dims):
            return name
    shapes = ", ".join(f"{name} ({shape})" for name, shape in list(known.items())[:12])
    raise CompileTargetUnavailable(
        f"MaxText compiles the TPU topologies it names (accelerator_to_spec_map), and none "
        f"of its {prefix} names is {'x'.join(map(str, dims))}: plan on one of "
        f"{shapes or 'its shapes'}{', ...' if len(known) > 12 else ''}"
    )


def _batch(request: CompileCheckRequest, plan: dict[str, Any]) -> list[int]:
    shape = request.batch_shape or (plan.get("batch") or {}).get("shape")
    if not shape:
        raise ServiceError(
            "the check needs a batch: send batch_shape (its first entry is the global batch), "
            "or plan the mesh with batch_shape",
            code="invalid_batch_shape",
        )
    return [int(n) for n in shape]


def _refuse_target(plan: dict[str, Any], extra: dict[str, Any]) -> None:
    """422 for every plan that is not of TPU hardware."""
    if not plan.get("hardware"):
        what = "a live plan of this host's devices" if plan.get("live") else "abstract"
        raise CompileTargetUnavailable(
            f"program 'maxtext' compiles MaxText's training step for a TPU hardware plan "
            f"(through libtpu, without the chips); this plan is {what}, with no TPU "
            "target: plan it with TPU hardware (e.g. {'hardware': 'tpu-v5e', 'topology': "
            "'2x2', 'ici': {'fsdp': 4}}), or use program 'datarax'",
            extra=extra,
        )
    hardware = get_hardware(plan["hardware"])
    if hardware.kind != "tpu":
        raise CompileTargetUnavailable(
            f"program 'maxtext' compiles for TPU targets only (MaxText's ahead-of-time "
            f"path through libtpu needs no chips; a {hardware.name} ({hardware.kind.upper()}) "
            "program needs the GPUs themselves, and this host has none of them); the "
            "estimate is in 'estimate'",
            extra=extra,
        )


def maxtext_target(
    plan: dict[str, Any], request: CompileCheckRequest, settings: Settings
) -> dict[str, Any]:
    """What the MaxText compile of ``request`` on ``plan`` is: ``{"program": "maxtext",
    "target", "args", "env", "compile_topology", "compile_topology_num_slices",
    "hbm_bytes", "packages", "estimate"}``.

    Raises:
      CompileTargetUnavailable: not a TPU hardware plan, a topology MaxText does not name,
        no MaxText environment or no libtpu here.
      ServiceError: the library's codes (the model, the batch, the launch's own refusals).
    """
    del settings  # the same for every host: the launch config is the plan's
    try:
        spec = model_spec(request.model.model_dump(exclude_none=True))
    except PlanError as error:
        raise from_library(error) from None
    shape = _batch(request, plan)
    optimizer = optimizer_name(request.optimizer)
    zero1 = bool(plan.get("shard_over_data")) or shards_over_data(request.optimizer)
    estimate = (
        _estimate(plan, spec.to_json(), optimizer, shape[0], zero1=zero1, program="maxtext")
        if plan.get("axes")
        else None
    )
    extra = {"estimate": estimate}
    _refuse_target(plan, extra)
    hardware = get_hardware(plan["hardware"])
    site = maxtext_site()
    packages = installed_packages(site)
    if "maxtext" not in packages:
        raise CompileTargetUnavailable(
            f"MaxText's compile environment is not installed here ({site}): {_INSTALL_HINT}",
            extra=extra,
        )
    if _version("libtpu") is None:
        raise CompileTargetUnavailable(
            "TPU plans compile through libtpu, which is not installed here; install the "
            "extra: pip install -c constraints.txt 'jax[tpu]==0.12.0.1'",
            extra=extra,
        )
    name = compile_topology(site, hardware.name, str(plan["topology"]))
    summary = {**plan_summary(plan), "model": spec.to_json(), "batch": {"shape": shape}}
    if "optimizer" in request.model_fields_set:  # else the launch's (MaxText's default)
        summary.update(optimizer=optimizer, shard_over_data=zero1)
    try:
        launch = launch_config(summary, "maxtext")
    except PlanError as error:
        raise from_library(error) from None
    assert isinstance(launch, MaxTextLaunch)  # the maxtext target's answer
    slices = int(plan.get("slices") or 1)
    return {
        "program": "maxtext",
        "target": {
            "kind": "tpu",
            "hardware": hardware.name,
            "topology": plan["topology"],
            "slices": slices,
            "hbm_source": f"catalog:{hardware.name}",
        },
        "args": list(launch.args),
        "env": {k: v for k, v in (launch.env or {}).items() if k in LAUNCH_ENV},
        "compile_topology": name,
        "compile_topology_num_slices": slices,
        "hbm_bytes": hardware.hbm_bytes,
        "packages": packages,
        "estimate": estimate,
    }


def maxtext_cache_key(work: dict[str, Any]) -> str:
    """sha256 over what changes MaxText's compiled program: its arguments and XLA flags,
    the topology, the memory figure, every package of its environment and the compiler's
    versions."""
    described = {
        "program": "maxtext",
        "driver": DRIVER_VERSION,
        "versions": compiler_versions(),
        "packages": work["packages"],
        "target": work["target"],
        "args": work["args"],
        "env": work["env"],
        "compile_topology": work["compile_topology"],
        "slices": work["compile_topology_num_slices"],
        "hbm_bytes": work["hbm_bytes"],
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()
