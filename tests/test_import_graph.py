"""The import graph of ``datarax/`` and ``app/``, read from the source with ``ast``.

Every import counts, at module level and inside functions (a function-level import
still ties the two modules together); relative imports are resolved, and
``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to
``pkg``. Imports under ``if TYPE_CHECKING:`` never run and are left out. Checked:

- no cycle among the modules (the message names the cycle);
- no cycle among the packages of ``app/`` (package A imports package B, which imports A
  back, perhaps through others); ``datarax/``'s package cycles only shrink (the ones left
  are listed in :data:`LIBRARY_PACKAGE_CYCLES_BEING_REMOVED`);
- ``datarax`` imports nothing of ``app``, FastAPI, Starlette or pydantic;
- ``app`` uses the library through its public modules: nothing private (``_name``) and
  nothing of the client;
- ``app/runtime/`` (the runtime process) imports nothing of the HTTP side;
- ``app/services``, ``app/storage``, ``app/codecs`` and ``app/workers`` import nothing of
  ``app/api``, ``app.main``, FastAPI, Starlette or uvicorn;
- no module under ``app/api/routes/`` imports another route module;
- ``datarax.client`` (the service's Python client) imports nothing of ``app``, FastAPI,
  Starlette or pydantic either: the library rule covers it, and it imports no JAX; of the
  rest of the library only the JAX-free modules it shares with the service
  (:data:`CLIENT_SHARED`), which import no JAX either.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("datarax", "app")
LIBRARY_FORBIDDEN = ("app", "fastapi", "starlette", "pydantic", "pydantic_settings", "uvicorn")
RUNTIME_FORBIDDEN = (
    "app.api.routes",
    "app.services",
    "app.api.deps",
    "app.main",
    "app.api.middleware",
    "fastapi",
    "starlette",
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    return {
        _module_name(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST):
    """Every Import/ImportFrom node, skipping ``if TYPE_CHECKING:`` bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _imports(name: str, path: Path, modules: set[str]) -> set[str]:
    """Fully qualified names ``name`` imports (modules of ours, or external names)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            continue
        if node.level:
            base = name.split(".") if is_package else name.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        for alias in node.names:
            candidate = f"{target}.{alias.name}"
            found.add(candidate if candidate in modules else target)
    return found


def _graph() -> dict[str, set[str]]:
    sources = _sources()
    modules = set(sources)
    return {name: _imports(name, path, modules) for name, path in sources.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One concrete cycle per strongly connected component (Tarjan), in import order."""
    edges = {m: sorted(t for t in targets if t in graph) for m, targets in graph.items()}
    return [_path_in(component, edges) for component in _components(edges)]


def _components(edges: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected components of ``edges`` that hold a cycle (two members or
    more, or one that imports itself), each sorted (Tarjan, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(start: str) -> None:
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges[node]:
                    components.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return components


def _path_in(component: list[str], edges: dict[str, list[str]]) -> list[str]:
    """A cycle through the first member of ``component``, found by breadth-first search."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in edges[node]:
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if child in members and child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    return component


def _fmt(cycle: list[str]) -> str:
    return " -> ".join(cycle)


def test_the_cycle_finder_finds_cycles_and_only_them():
    graph = {
        "a": {"b"},
        "b": {"c", "numpy"},
        "c": {"a"},
        "d": {"d"},
        "e": {"a"},
    }
    assert sorted(map(_fmt, _cycles(graph))) == ["a -> b -> c -> a", "d -> d"]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_relative_and_package_imports_are_resolved(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text(
        "from . import channel, helper_value\n"
        "from .runtime import server\n"
        "def f():\n"
        "    import app.storage.db\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    import app.main\n"
    )
    modules = {"app.channel", "app.runtime.server", "app.storage.db", "app.main"}
    found = _imports("app.mod", source, modules)
    assert {"app.channel", "app", "app.runtime.server", "app.storage.db"} <= found
    assert "app.main" not in found


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles: " + "; ".join(map(_fmt, cycles))


# The package graph. A package is a directory of modules under datarax/ or app/ (a
# namespace package without __init__.py, such as app/services/, counts as one); its
# modules are the files directly inside it (its __init__.py included), not those of its
# subpackages. Package P imports package Q when one of P's modules imports a module of Q
# or below (of Q's subpackages), or Q itself. Left out: a package's imports of its own
# modules, and the step up to P's own parents (every package is below ``app`` or
# ``datarax``: app.api.routes importing app.services.jobs imports app.services, not
# app). A subpackage is otherwise a package like any other: app.services.jobs importing
# a module directly in app.services while app.services imports app.services.jobs back
# is a cycle too.


def _package_of(sources: dict[str, Path]) -> dict[str, str]:
    """Each module of ours, and each package, -> the package it belongs to."""
    package_of = {
        name: ".".join(path.parent.relative_to(ROOT).parts) for name, path in sources.items()
    }
    for package in set(package_of.values()):
        package_of.setdefault(package, package)
    return package_of


def _package_graph(
    graph: dict[str, set[str]], package_of: dict[str, str]
) -> dict[str, dict[str, list[str]]]:
    """Package -> each package it imports -> the module imports that make the edge
    (``"a.x -> b.y"``), read from the module ``graph``; external imports are left out."""

    def self_and_parents(package: str) -> list[str]:
        parts = package.split(".")
        return [".".join(parts[:end]) for end in range(len(parts), 0, -1)]

    packages: dict[str, dict[str, list[str]]] = {p: {} for p in set(package_of.values())}
    for module, targets in graph.items():
        source = package_of[module]
        above_source = self_and_parents(source)
        for target in sorted(targets):
            if target not in package_of:
                continue  # not ours
            holder, *holder_parents = self_and_parents(package_of[target])
            imported = [holder, *(p for p in holder_parents if p not in above_source)]
            for package in imported:
                if package != source:
                    packages[source].setdefault(package, []).append(f"{module} -> {target}")
    return packages


def _package_cycles(root: str) -> list[tuple[frozenset[str], str]]:
    """The package cycles under ``root`` (``"app"`` or ``"datarax"``): each one's packages
    and a readable account (one cycle through them, and the imports behind each step)."""
    sources = _sources()
    packages = _package_graph(_graph(), _package_of(sources))
    edges = {p: sorted(targets) for p, targets in packages.items()}
    found = []
    for component in _components(edges):
        if component[0] != root and not component[0].startswith(root + "."):
            continue  # the library imports nothing of the service: no cycle spans both
        cycle = _path_in(component, edges)
        steps = [f"  {a} -> {b}: {', '.join(packages[a][b][:3])}" for a, b in pairwise(cycle)]
        found.append((frozenset(component), "\n".join([_fmt(cycle), *steps])))
    return found


def test_the_package_graph_groups_modules_by_their_folder():
    package_of = {
        **{"r": "r", "r.m": "r"},
        **{"r.a": "r.a", "r.a.x": "r.a", "r.a.b": "r.a.b", "r.a.b.y": "r.a.b"},
        **{"r.c": "r.c", "r.c.z": "r.c", "r.c.d": "r.c.d", "r.c.d.w": "r.c.d"},
    }
    graph = {
        "r.a": {"r.a.x"},  # its own module: no edge
        "r.a.x": {"r.c.d.w", "numpy"},  # r.c.d and r.c above it, not r; numpy: no edge
        "r.a.b.y": {"r.a.x", "r.c", "r.m"},  # its parents' modules count; r.c by name
        "r.c.d.w": {"r.c.z", "r.a.b.y"},  # r.a.b and r.a, not r.c (its own parent)
    }
    packages = _package_graph(graph, package_of)
    assert packages == {
        "r": {},
        "r.a": {"r.c.d": ["r.a.x -> r.c.d.w"], "r.c": ["r.a.x -> r.c.d.w"]},
        "r.a.b": {"r.a": ["r.a.b.y -> r.a.x"], "r.c": ["r.a.b.y -> r.c"], "r": ["r.a.b.y -> r.m"]},
        "r.c": {},
        "r.c.d": {
            "r.c": ["r.c.d.w -> r.c.z"],
            "r.a.b": ["r.c.d.w -> r.a.b.y"],
            "r.a": ["r.c.d.w -> r.a.b.y"],
        },
    }
    edges = {p: sorted(targets) for p, targets in packages.items()}
    # r.c.d imports r.a (a module below it) and r.a imports r.c.d back: a two-way pair.
    assert _components(edges) == [["r.a", "r.a.b", "r.c.d"]]


def test_no_package_of_the_service_imports_a_package_that_imports_it_back():
    # A module two packages need sits below both (app/core/database_url.py below
    # app/core/settings.py and app/storage/); errors live in app/core/errors.py, below all.
    cycles = _package_cycles("app")
    assert not cycles, "package cycles in app/:\n" + "\n".join(text for _, text in cycles)


LIBRARY_PACKAGE_CYCLES_BEING_REMOVED: tuple[frozenset[str], ...] = ()
"""The library's package cycles left today, being removed by the redesign that is
restructuring ``datarax/``. The test below lets them shrink, never grow; once the tuple is
empty it asserts that ``datarax/`` has no package cycle, as the service's test does."""


def test_the_library_package_cycles_only_shrink():
    cycles = _package_cycles("datarax")
    new = [
        text
        for packages, text in cycles
        if not any(packages <= known for known in LIBRARY_PACKAGE_CYCLES_BEING_REMOVED)
    ]
    assert not new, "new package cycles in datarax/:\n" + "\n".join(new)


def test_library_imports_nothing_of_the_service():
    bad = [
        f"{module} imports {target}"
        for module, targets in _graph().items()
        if module.split(".")[0] == "datarax"
        for target in sorted(targets)
        if target.split(".")[0] in LIBRARY_FORBIDDEN
    ]
    assert not bad, bad


def test_importing_the_library_loads_no_service_module_and_no_backend():
    """What the source rule above says, checked on a real import in a fresh interpreter."""
    code = (
        "import sys, datarax.distributed, datarax.models\n"
        "from jax._src import xla_bridge\n"
        f"bad = [m for m in sys.modules if m.split('.')[0] in {LIBRARY_FORBIDDEN!r}]\n"
        "assert not bad, bad\n"
        "assert not xla_bridge._backends, 'importing initialised a JAX backend'\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_the_service_uses_only_public_modules_of_the_library():
    # The client calls the service; it is not the service's library. What both need sits
    # below both, public (datarax/npz.py: the npz writer).
    bad = [
        f"{module} imports {target}"
        for module, targets in _graph().items()
        if module.split(".")[0] == "app"
        for target in sorted(targets)
        if target.startswith("datarax.")
        and (
            target.startswith("datarax.client")
            or any(part.startswith("_") for part in target.split("."))
        )
    ]
    assert not bad, bad


HTTP_MODULES = ("app.api", "app.main", "fastapi", "starlette", "uvicorn")
BELOW_HTTP = ("app.services", "app.storage", "app.codecs", "app.workers")


def test_services_storage_and_workers_import_nothing_of_http():
    bad = [
        f"{module} imports {target}"
        for module, targets in _graph().items()
        if any(module == p or module.startswith(p + ".") for p in BELOW_HTTP)
        for target in sorted(targets)
        if any(target == f or target.startswith(f + ".") for f in HTTP_MODULES)
    ]
    assert not bad, bad


def test_runtime_process_imports_nothing_of_the_http_side():
    if not (ROOT / "app" / "runtime").is_dir():
        pytest.skip("app/runtime/ does not exist yet: the runtime-process rule cannot be checked")
    bad = [
        f"{module} imports {target}"
        for module, targets in _graph().items()
        if module == "app.runtime" or module.startswith("app.runtime.")
        for target in sorted(targets)
        if any(target == f or target.startswith(f + ".") for f in RUNTIME_FORBIDDEN)
    ]
    assert not bad, bad


COMPILER_ALLOWED_APP = ("app.core.errors", "app.core.channel", "app.core.settings", "app.compiler")


def test_compile_worker_imports_nothing_of_the_http_side():
    # app/compiler/ runs in its own process: of the service it may use only the modules
    # both processes share (and the library), never the HTTP side or the runtime.
    bad = [
        f"{module} imports {target}"
        for module, targets in _graph().items()
        if module == "app.compiler" or module.startswith("app.compiler.")
        for target in sorted(targets)
        if (target == "app" or target.startswith("app."))
        and not any(target == a or target.startswith(a + ".") for a in COMPILER_ALLOWED_APP)
        or target.split(".")[0] in ("fastapi", "starlette")
    ]
    assert not bad, bad


def test_routes_import_no_other_route():
    bad = [
        f"{module} imports {target}"
        for module, targets in _graph().items()
        if module.startswith("app.api.routes.")
        for target in sorted(targets)
        if target.startswith("app.api.routes.") and target != module
    ]
    assert not bad, bad


CLIENT_SHARED = ("datarax.npz", "datarax.json_types")
"""The library modules the client may import: JAX-free code it shares with the service;
the answer types (``datarax.answers`` and its modules) too."""


def _client_shared(module: str) -> bool:
    return (
        module in CLIENT_SHARED
        or module == "datarax.answers"
        or module.startswith("datarax.answers.")
    )


def test_client_imports_no_service_and_no_jax():
    bad = [
        f"{module} imports {target}"
        for module, targets in _graph().items()
        if module == "datarax.client"
        or module.startswith("datarax.client.")
        or _client_shared(module)
        for target in sorted(targets)
        if target.split(".")[0] in (*LIBRARY_FORBIDDEN, "jax", "flax", "optax")
        or (
            target.startswith("datarax.")
            and not target.startswith("datarax.client")
            and not _client_shared(target)
        )
    ]
    assert not bad, bad


CONNECTION_METHODS = frozenset(
    {
        "write",
        "read",
        "execute",
        "execute_here",
        "write_here",
        "write_grouped",
        "write_grouped_here",
    }
)
"""``Store`` methods that hand a function the raw connection: for ``app/storage/`` only."""


def _names_a_store(node: ast.expr) -> bool:
    """``store``, ``_store``, or an attribute so named (``self.store``, ``app.state.store``)."""
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    return name in ("store", "_store")


def _connection_uses(path: Path) -> list[str]:
    """Where ``path`` passes a lambda or one of its functions to a connection method of
    something named a store, or takes such a method to call it elsewhere."""
    tree = ast.parse(path.read_text(), filename=str(path))
    functions = {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in CONNECTION_METHODS
            and _names_a_store(node.value)
            and id(node) not in called
        ):  # ``write = store.write_grouped_here``: the method handed on, called elsewhere
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} takes .{node.attr}")
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in CONNECTION_METHODS
            and _names_a_store(node.func.value)
        ):
            continue
        if any(
            isinstance(arg, ast.Lambda) or (isinstance(arg, ast.Name) and arg.id in functions)
            for arg in node.args
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} calls .{node.func.attr}(fn)")
    return found


def test_no_module_outside_storage_holds_a_connection():
    # One package owns the database: outside app/storage/ nothing imports sqlite3 or runs
    # its own function over the store's connection; it calls typed per-table functions.
    outside = {
        name: path
        for name, path in _sources().items()
        if not (name == "app.storage" or name.startswith("app.storage."))
    }
    graph = _graph()
    bad = [f"{name} imports sqlite3" for name in outside if "sqlite3" in graph[name]]
    bad += [use for path in outside.values() for use in _connection_uses(path)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("entry", ["app.main", "app.cli"])
def test_the_http_process_imports_no_jax(entry):
    # The HTTP process reduces NumPy arrays only (datarax.metrics.reductions); JAX,
    # flax and optax belong to the runtime process. Checked on a real import in a fresh
    # interpreter with the service's environment.
    code = (
        f"import sys, {entry}\n"
        "bad = sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'flax', 'optax'})\n"
        "assert not bad, f'{bad} loaded'\n"
        "print('ok')\n"
    )
    import os  # here, not at the top: this test is one appended block

    env = {**os.environ, "JAX_PLATFORMS": "cpu", "DATARAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
