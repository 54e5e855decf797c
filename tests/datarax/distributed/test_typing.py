"""The type aliases (defined in datarax.tree_types, re-exported at upstream's path
datarax.distributed.typing): every alias is a real ``type`` alias (never ``Any``), the
same object under both paths, the Literal aliases list exactly the values the run-time
checks accept (one source of truth: ``reductions.NAN_POLICIES`` / ``REDUCE_OPS``,
``collectives._GRADIENT_REDUCTIONS``), both modules stay free of JAX and NumPy at run
time, and mypy accepts a nested pytree where a ``PyTree`` is expected while rejecting what
is not one."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeAliasType, get_args, get_origin

import pytest

import datarax.distributed.typing as upstream_typing
import datarax.tree_types as dt
from datarax.distributed import metrics
from datarax.metrics import reductions
from datarax.spmd import collectives

ROOT = Path(__file__).resolve().parents[3]
NoneType = type(None)

ALIASES = [
    "GradientReduction",
    "MetricOp",
    "NamedLeaves",
    "NanPolicy",
    "PyTree",
    "PyTreeLeaf",
    "ReduceOp",
    "Scalar",
]


@pytest.mark.parametrize("module", [dt, upstream_typing], ids=lambda m: m.__name__)
def test_all_lists_exactly_the_aliases(module):
    assert sorted(module.__all__) == ALIASES


@pytest.mark.parametrize("name", ALIASES)
def test_upstreams_path_re_exports_the_same_alias(name):
    assert getattr(upstream_typing, name) is getattr(dt, name)


@pytest.mark.parametrize("name", ALIASES)
def test_each_name_is_a_type_alias_not_any(name):
    alias = getattr(dt, name)
    assert isinstance(alias, TypeAliasType)
    assert alias is not Any
    assert alias.__name__ == name
    assert alias.__module__ == "datarax.tree_types"
    assert alias.__type_params__ == ()


# ---------------------------------------------------------------- Literal aliases


@pytest.mark.parametrize(
    ("alias", "values"),
    [
        pytest.param(dt.ReduceOp, reductions.REDUCE_OPS, id="ReduceOp=REDUCE_OPS"),
        pytest.param(dt.NanPolicy, reductions.NAN_POLICIES, id="NanPolicy=NAN_POLICIES"),
        pytest.param(
            dt.GradientReduction,
            collectives._GRADIENT_REDUCTIONS,
            id="GradientReduction=_GRADIENT_REDUCTIONS",
        ),
    ],
)
def test_literal_aliases_list_exactly_the_checked_values(alias, values):
    value = alias.__value__
    assert get_origin(value) is Literal
    assert get_args(value) == tuple(values)  # same values, same order
    assert all(type(v) is str for v in get_args(value))
    assert len(set(values)) == len(values)


@pytest.mark.parametrize("name", ["REDUCE_OPS", "NAN_POLICIES"])
def test_metrics_re_exports_the_same_tuples(name):
    assert getattr(metrics, name) is getattr(reductions, name)


# ---------------------------------------------------------------- structural aliases


def test_pytree_is_leaves_mappings_and_sequences_of_itself():
    args = get_args(dt.PyTree.__value__)
    assert args == (dt.PyTreeLeaf, Mapping[str, dt.PyTree], Sequence[dt.PyTree])
    mapping, sequence = args[1], args[2]
    assert get_origin(mapping) is Mapping and get_args(mapping) == (str, dt.PyTree)
    assert get_origin(sequence) is Sequence and get_args(sequence) == (dt.PyTree,)
    assert get_args(mapping)[1] is dt.PyTree  # recursive: the alias itself, not Any


def test_metric_op_is_a_name_a_callable_or_none():
    args = get_args(dt.MetricOp.__value__)
    assert args == (str, Callable[[Any], Any], NoneType)
    assert get_origin(args[1]) is Callable


def test_named_leaves_is_a_list_of_path_leaf_pairs():
    value = dt.NamedLeaves.__value__
    assert value == list[tuple[str, Any]]
    assert get_origin(value) is list
    (pair,) = get_args(value)
    assert get_origin(pair) is tuple and get_args(pair)[0] is str


def test_leaf_and_scalar_aliases_name_arrays_and_scalars(monkeypatch):
    """They name JAX and NumPy types, imported only under TYPE_CHECKING: given those
    names, the lazily evaluated values are the documented unions."""
    import jax
    import numpy as np
    from numpy.typing import NDArray

    for name, value in [("jax", jax), ("np", np), ("NDArray", NDArray)]:
        monkeypatch.setattr(dt, name, value, raising=False)
    assert get_args(dt.Scalar.__value__) == (bool, int, float, complex, np.generic)
    assert get_args(dt.PyTreeLeaf.__value__) == (
        jax.Array,
        NDArray[Any],
        dt.Scalar,
        str,
        bytes,
        NoneType,
    )
    assert isinstance(dt.PyTreeLeaf.__value__, types.UnionType)


@pytest.mark.parametrize("module", ["datarax.tree_types", "datarax.distributed.typing"])
def test_the_module_imports_neither_jax_nor_numpy_at_run_time(module):
    code = textwrap.dedent(
        f"""
        import sys
        import {module} as t
        assert "jax" not in sys.modules and "numpy" not in sys.modules, "imported"
        t.ReduceOp.__value__, t.NanPolicy.__value__, t.PyTree.__value__
        try:
            t.PyTreeLeaf.__value__
        except NameError as e:
            print("lazy", e.name)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "lazy jax"  # evaluated on access, not at import


# ---------------------------------------------------------------- mypy, statically

# (id, line, rejected): each line is one assignment in the probe module.
PROBE = [
    (
        "nested-dict-list-tuple",
        'good_tree: PyTree = {"a": [1, 2.0, None], "b": ("s", b"x")}',
        False,
    ),
    ("deep-nesting", 'deep: PyTree = {"z": [{"a": [[{"b": (True, 3j)}]]}]}', False),
    ("numpy-leaves", 'np_tree: PyTree = {"x": np.zeros(3), "y": [np.float32(1)]}', False),
    ("jax-leaf", 'jax_tree: PyTree = [jnp.ones(2), {"w": jnp.zeros((2, 2))}]', False),
    ("bare-leaf", "leaf: PyTree = 0.5", False),
    ("none", "nothing: PyTree = None", False),
    ("set", "bad_set: PyTree = {1, 2}", True),
    ("object", "bad_object: PyTree = object()", True),
    ("int-keys", 'bad_keys: PyTree = {1: "a"}', True),
    ("set-inside-list", "bad_inner: PyTree = [1, {2, 3}]", True),
    ("function-leaf", "bad_fn: PyTree = {'f': len}", True),
    ("reduce-op-valid", 'op: ReduceOp = "max"', False),
    ("reduce-op-invalid", 'bad_op: ReduceOp = "median"', True),
    ("nan-policy-valid", 'policy: NanPolicy = "omit"', False),
    ("nan-policy-invalid", 'bad_policy: NanPolicy = "ignore"', True),
    ("gradient-valid", 'grad: GradientReduction = "sum"', False),
    ("gradient-invalid", 'bad_grad: GradientReduction = "max"', True),
    ("metric-op-callable", "metric_op: MetricOp = lambda a: a", False),
    ("metric-op-invalid", "bad_metric_op: MetricOp = 3", True),
    ("named-leaves-valid", 'named: NamedLeaves = [("z/a/0", 1.0)]', False),
    ("named-leaves-invalid", "bad_named: NamedLeaves = [(0, 1.0)]", True),
]
HEADER = [
    "import jax.numpy as jnp",
    "import numpy as np",
    "from datarax.distributed.typing import (",
    "    GradientReduction, MetricOp, NamedLeaves, NanPolicy, PyTree, ReduceOp,",
    ")",
]


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory):
    """Line number -> mypy's error messages for the probe module (checked once)."""
    probe = tmp_path_factory.mktemp("mypy") / "probe.py"
    probe.write_text("\n".join(HEADER + [line for _, line, _ in PROBE]) + "\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--config-file",
            "/dev/null",
            str(probe),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode in (0, 1), out.stdout + out.stderr  # 2: mypy itself failed
    errors: dict[int, list[str]] = {}
    pattern = re.compile(rf"^{re.escape(str(probe))}:(\d+): error: (.*)$")
    for text in out.stdout.splitlines():
        if match := pattern.match(text):
            errors.setdefault(int(match[1]), []).append(match[2])
    return errors


def test_mypy_reports_nothing_in_the_probe_header(mypy_errors):
    # An unimportable datarax (wrong cwd) or a misspelled alias would surface here.
    assert [n for n in mypy_errors if n <= len(HEADER)] == []


@pytest.mark.parametrize(("line", "rejected"), [p[1:] for p in PROBE], ids=[p[0] for p in PROBE])
def test_mypy_accepts_pytrees_and_rejects_what_is_not_one(mypy_errors, line, rejected):
    number = len(HEADER) + 1 + [p[1] for p in PROBE].index(line)
    messages = mypy_errors.get(number, [])
    if rejected:
        assert messages, f"mypy accepted: {line}"
        codes = {m.rsplit("[", 1)[-1].rstrip("]") for m in messages}
        assert codes <= {"assignment", "dict-item", "list-item"}, messages  # a type error
    else:
        assert messages == [], messages
