"""The interpreted pass leaves out only tests that do not run the library in process.

tests/_passes.py reads each test's source; tests/conftest.py marks ``out_of_process`` the
tests it finds running the library only in child processes or not at all, and the
README's second pass (``ASYNCREPLICA_NO_EXTENSIONS=1 ... -m "not out_of_process"``) skips
them. These tests fail when the reading would leave out a test that reaches the library
(and so the compiled modules) in the test process.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import _passes
import pytest

ROOT = Path(__file__).resolve().parent.parent
HOT = [
    "asyncreplica._core._ledger",
    "asyncreplica._core._match",
    "asyncreplica._core._nest",
    "asyncreplica._core._report",
    "asyncreplica._runtime._inspect",
    "asyncreplica._runtime._issuing",
    "asyncreplica._runtime._collective",
]

HEADER = """\
import subprocess
import sys

import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._launch import find_mpiexec

DATA = [1, 2]
STRATEGY = ar.MirroredStrategy(["CPU:0"])


def _child(code):
    return subprocess.run([sys.executable, "-c", code], check=True)


def _local(x):
    return ar.PerReplica([x])


@pytest.fixture
def built(tmp_path):
    _child("import asyncreplica")
    return tmp_path
"""

CASES = {
    # a child process only
    "def test_child(tmp_path):\n    _child('print(1)')": "child processes",
    "def test_fixture(built):\n    assert built.exists()": "child processes",
    "def test_mpiexec():\n    find_mpiexec()\n    _child('x')": "child processes",
    "@pytest.mark.parametrize('n', DATA)\ndef test_param(n):\n    _child(str(n))": "child processes",
    "def test_files(tmp_path):\n    assert tmp_path.exists()": "no library",
    # the library in this process, however it is reached
    "def test_direct():\n    ar.MirroredStrategy()": "in process",
    "def test_helper():\n    _local(1)": "in process",
    "def test_module_value():\n    _child(str(STRATEGY))": "in process",
    "def test_local_import():\n    import asyncreplica\n    _child('x')": "in process",
    "def test_numpy():\n    np.ones(2)\n    _child('x')": "in process",
    "def test_dynamic():\n    __import__('asyncreplica')": "in process",
    "def test_importlib():\n    import importlib\n    importlib.import_module('x')": "in process",
    "def test_pytester(pytester):\n    _child('x')": "in process",
    "def test_unknown_fixture(strategy):\n    _child('x')": "in process",
    "@pytest.mark.parametrize('op', [ar.ReduceOp.SUM])\ndef test_deco(op):\n    _child(str(op))": "in process",
    "class TestC:\n    def test_m(self):\n        _child('x')": "in process",
    "@pytest.fixture(autouse=True)\ndef _reset():\n    ar.get_strategy()\n\n\n"
    "def test_after_autouse(tmp_path):\n    _child('x')": "in process",
    "@pytest.mark.usefixtures('strategy')\ndef test_uses(tmp_path):\n    _child('x')": "in process",
}


@pytest.mark.parametrize(("source", "expected"), list(CASES.items()), ids=list(range(len(CASES))))
def test_the_reading_of_a_test(tmp_path: Path, source: str, expected: str) -> None:
    path = tmp_path / "test_case.py"
    path.write_text(HEADER + "\n\n" + source + "\n")
    tree = ast.parse(source)
    node = tree.body[-1]
    name = node.body[0].name if isinstance(node, ast.ClassDef) else node.name  # type: ignore[attr-defined]
    assert _passes.classify(path, name) == expected


SIBLING = """\
import subprocess

import asyncreplica as ar


def launch(code):
    return subprocess.run(["python", "-c", code], check=True)


def strategy():
    return ar.MirroredStrategy()
"""


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # a helper of another test module of the folder is read there, by the same rules
        ("from test_sibling import launch\n\n\ndef test_s():\n    launch('x')", "child processes"),
        ("from test_sibling import strategy\n\n\ndef test_s():\n    strategy()", "in process"),
        # a name of it that is not a function (a constant, a class) counts as the library
        ("from test_sibling import ar\n\n\ndef test_s():\n    ar.get_strategy()", "in process"),
        # a module that is not a test module of the folder: an unknown one
        ("from conftest import launch\n\n\ndef test_s():\n    launch('x')", "in process"),
    ],
)
def test_a_helper_imported_from_a_sibling_test_module(
    tmp_path: Path, source: str, expected: str
) -> None:
    (tmp_path / "test_sibling.py").write_text(SIBLING)
    (tmp_path / "conftest.py").write_text(SIBLING)
    path = tmp_path / "test_case.py"
    path.write_text(source + "\n")
    assert _passes.classify(path, "test_s") == expected


@pytest.mark.parametrize(
    ("module", "name", "expected"),
    [
        (
            "tests/mpi/test_mpi_errors.py",
            "test_plain_values_reduce_as_in_one_process",
            "child processes",
        ),
        ("tests/docs/test_examples.py", "test_example_runs", "child processes"),
        ("tests/test_quality.py", "test_mypy_strict_is_clean", "child processes"),
        ("tests/mpi/test_mpi.py", "test_every_collective_matches_numpy", "child processes"),
        ("tests/docs/test_site.py", "test_mkdocs_build_strict", "child processes"),
        ("tests/test_bench.py", "test_quick_bench_writes_a_table_and_json", "in process"),
        ("tests/testing/test_plugin.py", "test_replicas_option", "in process"),
        (
            "tests/test_readme.py",
            "test_readme_error_excerpt_matches_the_real_message",
            "in process",
        ),
    ],
)
def test_the_suite_is_read_as_expected(module: str, name: str, expected: str) -> None:
    assert _passes.classify(ROOT / module, name) == expected


def test_allowed_library_functions_do_not_import_the_hot_path() -> None:
    for module in _passes.ALLOWED:
        path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = module.rsplit(".", node.level)[0] if node.level else ""
                full = f"{base}.{node.module}" if base and node.module else node.module or base
                imported.add(full)
                imported.update(f"{full}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                imported.update(a.name for a in node.names)
        assert not imported & set(HOT), f"{module} imports {sorted(imported & set(HOT))}"
        assert module not in HOT


def test_hot_modules_are_the_builds() -> None:
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    hooks = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["custom"]
    assert hooks["modules"] == HOT


def test_the_marker_is_set_on_collection(request: pytest.FixtureRequest) -> None:
    # this test runs the library in process (it imports nothing of it, but takes
    # `request`, a fixture the reading does not see into), so it is in both passes
    assert request.node.get_closest_marker(_passes.MARKER) is None
    assert _passes.classify(Path(__file__), "test_the_marker_is_set_on_collection") == "in process"


def test_the_readme_second_pass_uses_the_marker() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f'ASYNCREPLICA_NO_EXTENSIONS=1 python3 -m pytest -m "not {_passes.MARKER}"' in readme
    doc = textwrap.dedent(_passes.__doc__ or "")
    assert f'-m "not {_passes.MARKER}"' in doc
