"""The import rules of each layer (DESIGN §4), checked in fresh interpreters."""

from __future__ import annotations

import ast
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
