"""``python -m app.compiler.maxtext``: MaxText's own training step, compiled ahead of time
for a TPU topology through libtpu, for a compile check with ``"program": "maxtext"``.

Started once per check by :class:`app.services.compile_checks.maxtext_runner.MaxTextRunner`,
never by hand, with the isolated MaxText environment on ``PYTHONPATH`` (``.venv/maxtext``,
installed by ``make maxtext`` from ``requirements-maxtext.txt``), ``JAX_PLATFORMS=cpu``,
``TPU_SKIP_MDS_QUERY=1`` and the launch's ``LIBTPU_INIT_ARGS`` (the launch's XLA flags are
part of the program). It reads one JSON request on stdin::

    -> {"id", "args": ["key=value", ...], "compile_topology": "v5e-4",
        "compile_topology_num_slices": 1, "hbm_bytes"}
    <- {"id", "phase": "lowering"} then {"id", "phase": "compiling"}
    <- {"id", "result": {...}}  or  {"id", "error": {"code", "detail"}}

on its own copy of stdout (file descriptor 1 is pointed at stderr first: MaxText and
libtpu print a lot), and exits.

The step is MaxText's, built by MaxText's own functions in the order of its
``maxtext.trainers.pre_train.train_compile.main`` (0.2.5): ``pyconfig.initialize`` over
``configs/base.yml`` and the arguments (the ones ``launch`` writes, plus
``compile_topology``), ``get_topology_mesh``, ``get_shaped_inputs``, the ZeRO-1 shardings,
``get_functional_train_with_signature(train.train_step, ...)`` and ``jit_and_compile``;
then, where ``train_compile`` prints them, the compiled object's ``memory_analysis()``,
``cost_analysis()`` and HLO are read as the library's own compile checks read them
(:func:`datarax.spmd.compile_step.compiled_figures`). ``compile_s`` covers MaxText's
``jit_and_compile``, lowering included (``lower_s`` is null).

Outcomes: XLA's ``RESOURCE_EXHAUSTED``/``CompileTimeHbmOom`` is a result (``fits``
false, ``xla_error`` its text); a configuration MaxText refuses (``pyconfig`` raising) is
the error ``compile_failed`` whose detail starts "MaxText refused the configuration" and
quotes MaxText's message; any other failure ``compile_failed`` with its text.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import json
import logging
import os
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any

log = logging.getLogger("datarax.compiler.maxtext")

_PRNG_FLAG = "--xla_tpu_spmd_rng_bit_generator_unsafe=true"
"""What ``train_compile.main`` appends to ``LIBTPU_INIT_ARGS`` (with the unsafe_rbg PRNG)."""


def _is_oom(text: str) -> bool:
    return "RESOURCE_EXHAUSTED" in text or "CompileTimeHbmOom" in text


def _first_lines(error: BaseException, limit: int = 1200) -> str:
    text = str(error).strip() or type(error).__name__
    return f"{type(error).__name__}: {text[:limit]}"


def maxtext_version() -> str | None:
    try:
        return importlib.metadata.version("maxtext")
    except importlib.metadata.PackageNotFoundError:
        return None


def _config(request: dict[str, Any]) -> Any:
    """MaxText's config for the request (``pyconfig.initialize``, as train_compile's)."""
    pyconfig = importlib.import_module("maxtext.configs.pyconfig")
    maxtext = importlib.import_module("maxtext")
    base = Path(str(maxtext.__file__)).parent / "configs" / "base.yml"
    argv = [
        "train_compile",
        str(base),
        *request["args"],
        f"compile_topology={request['compile_topology']}",
        f"compile_topology_num_slices={int(request['compile_topology_num_slices'])}",
    ]
    return pyconfig.initialize(argv)


def compile_maxtext(request: dict[str, Any], on_phase: Any) -> dict[str, Any]:
    """Builds and compiles MaxText's train step for ``request``; returns the result.

    Raises:
      _Refused: MaxText refused the configuration.
      Exception: anything else that failed (not memory: that is a result).
    """
    import jax  # noqa: PLC0415 - after the environment is set

    from datarax.spmd.compile_step import compiled_figures  # noqa: PLC0415

    train_compile = importlib.import_module("maxtext.trainers.pre_train.train_compile")
    sharding = importlib.import_module("maxtext.utils.sharding")
    maxtext_utils = importlib.import_module("maxtext.utils.maxtext_utils")
    train = importlib.import_module("maxtext.trainers.pre_train.train")
    axis_rules = importlib.import_module("flax.core.spmd").logical_axis_rules

    jax.config.update("jax_default_prng_impl", "unsafe_rbg")
    on_phase("lowering")
    try:
        config = _config(request)
        train_compile.validate_config(config)
    except Exception as error:  # MaxText's checks raise ValueError, AssertionError, ...
        raise _Refused(_first_lines(error)) from error
    if config.enable_diloco:
        raise _Refused("enable_diloco: DiLoCo's step is not the one launch runs")
    mesh = train_compile.get_topology_mesh(config)
    shaped_args, shaped_kwargs, state_shardings, _, model = train_compile.get_shaped_inputs(
        mesh, config
    )
    params_shardings, state_shardings = sharding.maybe_update_params_sharding_with_opt(
        config, state_shardings
    )
    input_shardings = sharding.build_zero1_input_state_mesh_shardings(
        config, state_shardings, params_shardings
    )
    data_sharding = sharding.get_input_data_sharding(config, mesh)
    func, in_shard, out_shard, static_argnums, donate_argnums = (
        maxtext_utils.get_functional_train_with_signature(
            train.train_step, data_sharding, input_shardings, model, config, params_shardings
        )
    )
    on_phase("compiling")
    started = time.perf_counter()
    try:
        compiled = train_compile.jit_and_compile(
            func,
            shaped_args,
            shaped_kwargs,
            mesh,
            in_shard,
            out_shard,
            static_argnums,
            donate_argnums,
            config,
            axis_rules(config.logical_axis_rules),
        )
    except Exception as error:
        text = str(error)
        if not _is_oom(text):
            raise
        return {
            "fits": False,
            "memory": None,
            "flops": None,
            "bytes_accessed": None,
            "collectives": None,
            "lower_s": None,
            "compile_s": time.perf_counter() - started,
            "xla_error": text.strip()[:4000],
        }
    compile_s = time.perf_counter() - started
    figures = compiled_figures(compiled, request.get("hbm_bytes"))
    return {**figures, "lower_s": None, "compile_s": compile_s}


class _Refused(Exception):
    """MaxText refused the configuration (its own checks)."""


def _environment() -> None:
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["TPU_SKIP_MDS_QUERY"] = "1"
    os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    flags = os.environ.get("LIBTPU_INIT_ARGS", "")
    if _PRNG_FLAG not in flags.split():
        os.environ["LIBTPU_INIT_ARGS"] = (flags + " " + _PRNG_FLAG).strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.compiler.maxtext")
    parser.add_argument("--memory-mb", type=int, default=0, help="RLIMIT_AS cap, 0 = none")
    args = parser.parse_args(argv)
    logging.basicConfig(level="WARNING", stream=sys.stderr)
    _environment()
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # whatever MaxText, JAX or libtpu print goes to the log
    sys.stdout = sys.stderr
    if args.memory_mb > 0:
        limit = args.memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    def send(message: dict[str, Any]) -> None:
        try:
            text = json.dumps(message, allow_nan=False)
        except ValueError:  # a NaN or infinity in XLA's figures: JSON has none
            text = json.dumps(json.loads(json.dumps(message), parse_constant=lambda _: None))
        protocol.write(text + "\n")
        protocol.flush()

    request = json.loads(sys.stdin.readline() or "{}")
    cid = request.get("id")
    program = {"name": "maxtext", "version": maxtext_version()}
    try:
        result = compile_maxtext(request, lambda phase: send({"id": cid, "phase": phase}))
    except _Refused as error:
        detail = f"MaxText refused the configuration launch writes for this plan: {error}"
        send({"id": cid, "error": {"code": "compile_failed", "detail": detail}})
        return 0
    except MemoryError:
        detail = f"the MaxText compile ran out of memory (cap {args.memory_mb} MiB)"
        send({"id": cid, "error": {"code": "compile_failed", "detail": detail}})
        return 0
    except Exception as error:
        with contextlib.suppress(Exception):
            traceback.print_exc()
        send({"id": cid, "error": {"code": "compile_failed", "detail": _first_lines(error)}})
        return 0
    send({"id": cid, "result": {**result, "program": program}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
