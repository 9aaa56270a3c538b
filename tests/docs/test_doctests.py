"""Docstring examples run: every ``>>>`` example in asyncreplica's modules is a doctest.

Each module of ``asyncreplica`` and of the numpy backend is imported and passed to
:func:`doctest.testmod`; a module without examples passes trivially, so an example
added to any docstring is tested from then on without touching this file.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from types import ModuleType

import asyncreplica_numpy
import pytest

import asyncreplica

# Modules whose docstrings must keep at least one example (the API reference shows them).
MUST_HAVE_EXAMPLES = ("asyncreplica", "asyncreplica._values")
# The modules a public class may name as its __module__ (the ones users import from).
PUBLIC = (
    "asyncreplica",
    "asyncreplica.abc",
    "asyncreplica.lint",
    "asyncreplica.testing",
    "asyncreplica_numpy",
    "asyncreplica_cupy",
)
OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _module_names() -> list[str]:
    names = []
    for package in (asyncreplica, asyncreplica_numpy):
        names.append(package.__name__)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}."):
            if info.name.endswith("__main__"):
                continue  # running it would start the command line
            names.append(info.name)
    return sorted(names)


MODULES = _module_names()


class _Finder(doctest.DocTestFinder):
    """Finds the examples of classes whose ``__module__`` is a public module.

    ``asyncreplica`` sets ``__module__ = "asyncreplica"`` on its public classes (and
    ``asyncreplica.abc``, ``.lint`` and ``.testing`` on theirs), so the standard finder
    would think that ``asyncreplica._values.PerReplica`` comes from elsewhere and skip its
    examples. A class belongs to the module that binds it under its
    own name and whose functions it holds (functions keep their defining module).
    """

    def _from_module(self, module: ModuleType | None, object: object) -> bool:  # noqa: A002
        if module is not None and isinstance(object, type) and object.__module__ in PUBLIC:
            if module.__name__ == "asyncreplica":
                return False  # a re-export: its examples run with its defining module
            functions = [
                v for v in vars(object).values() if callable(v) and hasattr(v, "__module__")
            ]
            if functions:
                return any(f.__module__ == module.__name__ for f in functions)
            return getattr(module, object.__name__, None) is object
        return bool(super()._from_module(module, object))  # type: ignore[misc]


def _testmod(name: str) -> doctest.TestResults:
    module: ModuleType = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=OPTIONS, verbose=False)
    for test in _Finder().find(module, name):
        runner.run(test)
    runner.summarize(verbose=False)
    return doctest.TestResults(runner.failures, runner.tries)


def test_modules_are_found() -> None:
    assert "asyncreplica._values" in MODULES
    assert "asyncreplica_numpy._backend" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_pass(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    results = _testmod(name)
    report = capsys.readouterr().out
    assert results.failed == 0, f"{results.failed} doctest failure(s) in {name}:\n{report}"


@pytest.mark.parametrize("name", MUST_HAVE_EXAMPLES)
def test_examples_are_still_there(name: str) -> None:
    assert _testmod(name).attempted > 0, f"{name} lost its docstring examples"
