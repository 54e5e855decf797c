"""MaxText's own configuration checks as a judge of launch configs (DESIGN v1.4, "Every
input is used or refused": ``launch`` writes only what MaxText accepts).

:func:`maxtext_verdicts` runs MaxText's checks (the installed ``maxtext`` package,
``.venv/maxtext``: ``make maxtext``) on many launch configs in one subprocess:
``pyconfig.initialize`` over ``configs/base.yml`` and the launch's ``args``, as MaxText's
trainer (``maxtext.trainers.pre_train.train.initialize``) and the compile driver
(:mod:`app.compiler.maxtext`) call it, then the trainer's ``validate_train_config``. To
those args the judge adds only what stands in for the cluster: ``compile_topology`` and
``compile_topology_num_slices`` (as the compile driver does: no JAX distributed start)
and ``internal_compile=true internal_compile_num_devices=<the plan's devices>`` (MaxText's
own way to name a device count without a topology, so GPU plans count theirs too).

Run as a program (``PYTHONPATH=.venv/maxtext python tests/maxtext_judge.py``) it reads a
JSON list of ``{"args", "devices", "slices"}`` on stdin and writes one JSON list of
verdicts as its last line of stdout: ``{"refusal": null | MaxText's message}`` and, where
MaxText accepts, what it derived: ``batch`` (``micro_batch_size_to_train_on``, the
sequences of a forward pass), ``pipeline_parallel_layers``, ``num_pipeline_repeats`` and
``num_pipeline_microbatches``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SITE_ENV = "DATARAX_MAXTEXT_SITE"


def maxtext_site() -> Path:
    """MaxText's environment: ``DATARAX_MAXTEXT_SITE``, else ``.venv/maxtext``."""
    return Path(os.environ.get(SITE_ENV) or ROOT / ".venv" / "maxtext")


def require_maxtext() -> Path:
    """The MaxText site; without it the test skips saying so (fails with ``CI=true``)."""
    site = maxtext_site()
    if not (site / "maxtext" / "configs" / "pyconfig.py").is_file():
        message = (
            f"MaxText is not installed at {site}: its own configuration checks cannot judge "
            "the launch configs. Install it with `make maxtext` (make test does)"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return site


def maxtext_verdicts(
    configs: Sequence[dict[str, Any]], timeout: float = 600.0
) -> list[dict[str, Any]]:
    """MaxText's verdict on each ``{"args": [...], "devices": n, "slices": n}`` (see the
    module's docstring)."""
    site = require_maxtext()
    env = {
        **os.environ,
        "PYTHONPATH": str(site),
        "JAX_PLATFORMS": "cpu",
        "TPU_SKIP_MDS_QUERY": "1",
    }
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve())],
        input=json.dumps(list(configs)),
        capture_output=True,
        text=True,
        env=env,
        cwd=str(ROOT),
        timeout=timeout,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines, f"the MaxText judge failed:\n{done.stderr[-4000:]}"
    verdicts = json.loads(lines[-1])
    assert len(verdicts) == len(configs)
    return verdicts


_DERIVED = ("pipeline_parallel_layers", "num_pipeline_repeats", "num_pipeline_microbatches")


def _message(error: BaseException) -> str:
    """MaxText's own words: a pydantic error's ``Value error, ...`` line, else the text."""
    text = str(error).strip()
    match = re.search(r"(?:Value error|Assertion failed), (.*?) \[type=", text, re.S)
    return match.group(1).strip() if match else f"{type(error).__name__}: {text}"


def _judge(config: dict[str, Any], pyconfig: Any, train_utils: Any, base: Path) -> dict:
    argv = [
        "train",
        str(base),
        *config["args"],
        "compile_topology=v5e-4",
        f"compile_topology_num_slices={int(config.get('slices') or 1)}",
        "internal_compile=true",
        f"internal_compile_num_devices={int(config['devices'])}",
    ]
    try:
        checked = pyconfig.initialize(argv)
        train_utils.validate_train_config(checked)
    except (ValueError, AssertionError, TypeError, KeyError) as error:
        return {"refusal": _message(error)}
    derived = {key: getattr(checked, key) for key in _DERIVED}
    return {"refusal": None, "batch": checked.micro_batch_size_to_train_on, **derived}


def main() -> int:
    # MaxText's initialize exits the process on a refusal unless a test framework is
    # loaded, when it raises the refusal instead: the judge wants the refusal.
    import unittest  # noqa: F401, PLC0415

    import maxtext  # noqa: PLC0415
    from maxtext.configs import pyconfig  # noqa: PLC0415
    from maxtext.utils import train_utils  # noqa: PLC0415

    base = Path(str(maxtext.__file__)).parent / "configs" / "base.yml"
    configs = json.loads(sys.stdin.read())
    out = sys.stdout
    sys.stdout = sys.stderr  # MaxText prints; the verdicts are the last line
    verdicts = [_judge(config, pyconfig, train_utils, base) for config in configs]
    out.write(json.dumps(verdicts) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
