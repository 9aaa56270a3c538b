"""The import rules of each layer (DESIGN §4), checked in fresh interpreters."""

from __future__ import annotations

import ast
import itertools
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

FORBIDDEN = {
    # layer: modules it must never import (directly or through anything it imports)
    "asyncreplica._core": (
        "anyio",
        "asyncio",
        "trio",
        "sniffio",
        "numpy",
        "cupy",
        "mpi4py",
        "time",
    ),
    "asyncreplica._runtime": (
        "numpy",
        "cupy",
        "mpi4py",
        "asyncreplica_numpy",
        "asyncreplica_cupy",
        "asyncreplica_mpi",
    ),
}

# The packages under backends/: plugins that arrive through entry points only.
PLUGINS = tuple(
    sorted(p.name for p in (ROOT / "backends").iterdir() if (p / "__init__.py").exists())
)


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_source_imports_nothing_forbidden(layer: str) -> None:
    folder = ROOT / layer.replace(".", "/")
    for path in sorted(folder.glob("*.py")):
        for name in _imports(path):
            top = name.split(".")[0]
            assert top not in FORBIDDEN[layer], f"{path.name} imports {name}"


def test_core_imports_only_stdlib_and_exceptions() -> None:
    allowed_internal = ("asyncreplica._core", "asyncreplica._exceptions")
    for path in sorted((ROOT / "asyncreplica/_core").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                target = (
                    "asyncreplica._core"
                    if node.level == 1
                    else "asyncreplica." + (node.module or "")
                )
                if node.level == 1:
                    continue
                assert target.startswith(allowed_internal), f"{path.name} imports {target}"
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                assert node.module.split(".")[0] in sys.stdlib_module_names, (
                    f"{path.name} imports {node.module}"
                )
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert alias.name.split(".")[0] in sys.stdlib_module_names, (
                        f"{path.name} imports {alias.name}"
                    )


@pytest.mark.parametrize(
    ("module", "absent"),
    [
        (
            "asyncreplica._core._ledger",
            ("anyio", "asyncio", "trio", "numpy", "asyncreplica._runtime"),
        ),
        ("asyncreplica", ("numpy", "asyncreplica_numpy", "pytest", "trio")),
    ],
)
def test_importing_a_layer_loads_nothing_forbidden(module: str, absent: tuple[str, ...]) -> None:
    # A bare parent package, so that importing a submodule does not run
    # asyncreplica/__init__.py (which imports every layer).
    stub = (
        "import sys, types\n"
        "pkg = types.ModuleType('asyncreplica')\n"
        f"pkg.__path__ = [{str(ROOT / 'asyncreplica')!r}]\n"
        "sys.modules['asyncreplica'] = pkg\n"
    )
    code = (
        (stub if module != "asyncreplica" else "")
        + f"import sys, importlib; importlib.import_module({module!r})\n"
        f"loaded = [m for m in {absent!r} if m in sys.modules]\n"
        "print(','.join(loaded))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""


def test_backends_import_no_scheduler_internals() -> None:
    for path in sorted((ROOT / "backends").glob("*/*.py")):
        for name in _imports(path):
            assert not name.startswith(("asyncreplica._core", "asyncreplica._runtime")), (
                f"{path} imports {name}"
            )


def test_no_backend_imports_another_backends_private_module() -> None:
    """What backends share lives in a module meant for it (asyncreplica_numpy.interop)."""
    for path in sorted((ROOT / "backends").glob("*/*.py")):
        own = path.parent.name
        for name in _imports(path):
            package, _, rest = name.partition(".")
            if package.startswith("asyncreplica_") and package != own:
                private = [part for part in rest.split(".") if part.startswith("_")]
                assert not private, f"{path} imports {name}, a private module of {package}"


def test_runtime_names_no_plugin_package() -> None:
    # Not even as a string for importlib: backends and process groups (MPI) arrive
    # through their entry-point groups (DESIGN section 4).
    assert "asyncreplica_mpi" in PLUGINS
    for path in sorted((ROOT / "asyncreplica/_runtime").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for plugin in PLUGINS:
                    assert plugin not in node.value, f"{path.name} names {plugin}: {node.value!r}"


def test_every_plugin_is_registered_through_an_entry_point() -> None:
    import importlib.metadata

    targets = {
        ep.value.split(":")[0].split(".")[0]
        for group in ("asyncreplica.backends", "asyncreplica.process_groups")
        for ep in importlib.metadata.entry_points(group=group)
    }
    assert set(PLUGINS) <= targets
    groups = {
        ep.name: ep.value
        for ep in importlib.metadata.entry_points(group="asyncreplica.process_groups")
    }
    assert groups.get("mpi") == "asyncreplica_mpi:MPIProcessGroup"


# -- the runtime's import graph -------------------------------------------------------
#
# Drawn from the sources with ast, counting every import: at module level, under
# ``if TYPE_CHECKING:`` and inside functions. A circle, even one made only of types or
# of imports deferred into functions, means two modules that cannot be read (or
# compiled) apart; the compiled core below is handed small protocols
# (``_runtime/_protocols.py``) or plain data instead of naming the classes above it.

GRAPH_PACKAGES = ("asyncreplica/_runtime", "asyncreplica/_tracing")

# The one exception: ``ReplicaContext.strategy``, public, is annotated ``-> Strategy``
# (TensorFlow keeps the two classes in one module). Only this import, and only under
# TYPE_CHECKING: at run time ``_strategy`` is above ``_context``.
PUBLIC_TYPE_EDGES = {
    ("asyncreplica._runtime._context", "asyncreplica._runtime._strategy"),
}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_edges(path: pathlib.Path, source: str | None = None) -> list[tuple[str, str, int]]:
    """``(imported module, kind, line)`` for each import in ``path``, relative ones resolved.

    ``kind`` is ``module``, ``TYPE_CHECKING`` or ``function``. ``from . import x`` names
    the submodule ``x`` when there is one.
    """
    here = _module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    edges: list[tuple[str, str, int]] = []

    def visit(node: ast.AST, kind: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = kind
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                inner = "TYPE_CHECKING"
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                inner = "function" if kind == "module" else kind
            if isinstance(child, ast.Import):
                edges.extend((alias.name, kind, child.lineno) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package[: len(package) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                edges.append((target, kind, child.lineno))
                edges.extend(
                    (f"{target}.{alias.name}", kind, child.lineno) for alias in child.names
                )
            visit(child, inner)

    visit(ast.parse(path.read_text(encoding="utf-8") if source is None else source), "module")
    return edges


def _graph() -> dict[str, dict[str, list[str]]]:
    """module -> imported module -> where (``file:line (kind)``), among GRAPH_PACKAGES."""
    paths = {
        _module_name(p): p for top in GRAPH_PACKAGES for p in sorted((ROOT / top).rglob("*.py"))
    }
    graph: dict[str, dict[str, list[str]]] = {name: {} for name in paths}
    for name, path in paths.items():
        for target, kind, line in _import_edges(path):
            # A module's own package (``from . import x``) is being imported already.
            if target in paths and target != name and not name.startswith(target + "."):
                where = f"{path.relative_to(ROOT).as_posix()}:{line} ({kind})"
                graph[name].setdefault(target, []).append(where)
    return graph


def _reach(graph: dict[str, dict[str, list[str]]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph[name])
    return seen


def _cycle_through(graph: dict[str, dict[str, list[str]]], start: str) -> list[str] | None:
    """A shortest circle of imports from ``start`` back to it, as ``a -> b`` lines."""
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for name in frontier:
            for target in graph[name]:
                if target == start:
                    chain = [name]
                    while chain[-1] != start:
                        chain.append(parents[chain[-1]])
                    chain.reverse()
                    steps = [*chain, start]
                    return [
                        f"{a} -> {b} at {', '.join(graph[a][b])}"
                        for a, b in itertools.pairwise(steps)
                    ]
                if target not in parents:
                    parents[target] = name
                    following.append(target)
        frontier = following
    return None


def test_the_runtime_has_no_import_circle() -> None:
    graph = _graph()
    assert "asyncreplica._runtime._collective" in graph  # the graph is drawn
    for source, target in PUBLIC_TYPE_EDGES:
        wheres = graph[source].pop(target, [])
        for where in wheres:
            assert where.endswith("(TYPE_CHECKING)"), f"{source} imports {target} at {where}"
    circles = {}
    for name in sorted(graph):
        cycle = _cycle_through(graph, name)
        if cycle is not None:
            circles[frozenset(step.split(" ")[0] for step in cycle)] = cycle
    assert not circles, "import circles among the runtime's modules:\n" + "\n\n".join(
        "\n".join(cycle) for cycle in circles.values()
    )


def test_the_public_type_edges_listed_are_still_there() -> None:
    """An exception that no longer exists is removed from PUBLIC_TYPE_EDGES."""
    graph = _graph()
    for source, target in sorted(PUBLIC_TYPE_EDGES):
        assert target in graph[source], f"{source} no longer imports {target}: drop the entry"


def _compiled_modules() -> list[str]:
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    modules: list[str] = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["custom"][
        "modules"
    ]
    return modules


def test_the_compiled_modules_import_nothing_above_them() -> None:
    """Not even for types: what a compiled module reaches never reaches it back."""
    graph = _graph()  # every import, the public type edges included
    compiled = [name for name in _compiled_modules() if name in graph]
    assert "asyncreplica._runtime._collective" in compiled
    assert "asyncreplica._runtime._issuing" in compiled
    for name in compiled:
        above = {other for other in graph if name in _reach(graph, other)}
        assert above, f"nothing imports {name}?"
        reached = _reach(graph, name) & above
        assert not reached, f"{name} reaches {sorted(reached)}, which import it:\n" + "\n".join(
            _cycle_through(graph, name) or []
        )


def test_a_circle_is_found_and_shown() -> None:
    graph: dict[str, dict[str, list[str]]] = {
        "a": {"b": ["a.py:1 (module)"]},
        "b": {"c": ["b.py:2 (TYPE_CHECKING)"]},
        "c": {"a": ["c.py:3 (function)"]},
        "d": {"a": ["d.py:4 (module)"]},
    }
    assert _cycle_through(graph, "a") == [
        "a -> b at a.py:1 (module)",
        "b -> c at b.py:2 (TYPE_CHECKING)",
        "c -> a at c.py:3 (function)",
    ]
    assert _cycle_through(graph, "d") is None
    assert _reach(graph, "d") == {"a", "b", "c"}


def test_imports_of_every_kind_are_drawn() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import _b\n"
        "if TYPE_CHECKING:\n"
        "    from ._c import C\n"
        "def f():\n"
        "    from .._d import D\n"
    )
    edges = _import_edges(ROOT / "asyncreplica/_runtime/_x.py", source)
    assert ("asyncreplica._runtime._b", "module", 2) in edges
    assert ("asyncreplica._runtime._c", "TYPE_CHECKING", 4) in edges
    assert ("asyncreplica._d", "function", 6) in edges
