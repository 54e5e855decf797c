"""The distributions the device check carries as wheels to a lent machine with no network:
derived from the resolved dependencies, not listed by hand.

The closure of the project's runtime dependencies and of the test tools the GPU tests
need (``pytest``, ``pytest-timeout``), each requirement's markers evaluated for this
Python, read from the installed distributions' metadata (``importlib.metadata``), less
what the accelerator image keeps: the compiled numerical stack (:data:`KEPT`: jaxlib and
its CUDA or TPU plugins, numpy, scipy, ml_dtypes, opt_einsum), whose builds must match the
image's drivers. A new dependency of the service is in the list the next time it is
derived: ``benchmarks/device_check.sh --fetch`` downloads exactly these, at the
``constraints.txt`` pins.

Run: ``python -m benchmarks.offline_wheels`` (one name a line).
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
TEST_TOOLS = ("pytest", "pytest-timeout")
KEPT = re.compile(
    r"^(jaxlib|jax-cuda\d+-.*|jax-tpu-.*|libtpu.*|nvidia-.*|numpy|scipy|ml-dtypes|opt-einsum)$"
)
"""Distributions the accelerator image keeps (normalised names)."""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def offline_distributions() -> list[str]:
    """The carried distributions' names (normalised, sorted)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo = [Requirement(r) for r in [*project["dependencies"], *TEST_TOOLS]]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = _norm(req.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue  # not installed here: not resolved for this platform
        todo.extend(Requirement(r) for r in requires)
    return sorted(name for name in seen if not KEPT.match(name))


def main() -> int:
    print("\n".join(offline_distributions()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
