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
MUST_HAVE_EXAMPLES = ("asyncreplica._values",)
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


def _testmod(name: str) -> doctest.TestResults:
    module: ModuleType = importlib.import_module(name)
    return doctest.testmod(module, optionflags=OPTIONS, report=True, verbose=False)


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
