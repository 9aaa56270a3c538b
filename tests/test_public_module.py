"""Public classes name ``asyncreplica`` as their module, as trio's do (issue 16).

A traceback prints ``asyncreplica.ReplicaExitedError: ...``, the name a user imports, not
the private module that defines the class.
"""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys

import pytest

import asyncreplica as ar

CLASSES = [name for name in ar.__all__ if isinstance(getattr(ar, name), type)]

# The other public modules: each class they export that asyncreplica does not names them.
SUBMODULES = (
    "asyncreplica.abc",
    "asyncreplica.lint",
    "asyncreplica.testing",
    "asyncreplica_numpy",  # the backends that ship with asyncreplica
    "asyncreplica_cupy",
)
SUBMODULE_CLASSES = [
    (module, name)
    for module in SUBMODULES
    for name in importlib.import_module(module).__all__
    if isinstance(getattr(importlib.import_module(module), name), type) and name not in ar.__all__
]


def test_there_are_public_classes() -> None:
    assert {"ReplicaExitedError", "MirroredStrategy", "PerReplica", "ReduceOp"} <= set(CLASSES)


@pytest.mark.parametrize("name", CLASSES)
def test_public_class_module_is_asyncreplica(name: str) -> None:
    cls = getattr(ar, name)
    assert cls.__module__ == "asyncreplica"
    assert f"{cls.__module__}.{cls.__qualname__}" == f"asyncreplica.{name}"


def test_there_are_submodule_classes() -> None:
    assert {
        ("asyncreplica.lint", "Finding"),
        ("asyncreplica.testing", "BackendConformanceTests"),
        ("asyncreplica.abc", "Backend"),
        ("asyncreplica.abc", "Signature"),
        ("asyncreplica_numpy", "NumpyBackend"),
        ("asyncreplica_cupy", "CupyBackend"),
    } <= set(SUBMODULE_CLASSES)


@pytest.mark.parametrize(("module", "name"), SUBMODULE_CLASSES)
def test_submodule_class_module_is_its_public_module(module: str, name: str) -> None:
    cls = getattr(importlib.import_module(module), name)
    assert cls.__module__ == module
    assert getattr(importlib.import_module(cls.__module__), cls.__qualname__) is cls


def test_submodule_classes_are_public_before_their_module_is_imported() -> None:
    # The classes travel (pickled errors, reports) before anyone imports asyncreplica.abc.
    code = (
        "import sys, asyncreplica\n"
        "from asyncreplica._core._signature import Signature\n"
        "from asyncreplica._tools._lint import Finding\n"
        "assert 'asyncreplica.abc' not in sys.modules and 'asyncreplica.lint' not in sys.modules\n"
        "print(Signature.__module__, Finding.__module__)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert proc.stdout.split() == ["asyncreplica.abc", "asyncreplica.lint"]


def test_submodule_classes_still_pickle() -> None:
    from asyncreplica.abc import CallSite, CollectiveKind, LeafSpec, Signature
    from asyncreplica.lint import Finding

    signature = Signature(
        CollectiveKind.ALL_REDUCE,
        op=ar.ReduceOp.SUM,
        leaves=(LeafSpec((2,), "float32"),),
        call_path=(CallSite("train.py", 3, "step", 9),),
    )
    assert pickle.loads(pickle.dumps(signature)) == signature
    finding = Finding("train.py", 8, 18, 6, "all_reduce at line 8 is skipped")
    assert pickle.loads(pickle.dumps(finding)) == finding


def test_classes_still_pickle() -> None:
    assert pickle.loads(pickle.dumps(ar.ReduceOp.SUM)) is ar.ReduceOp.SUM
    options = ar.CommunicationOptions(timeout_seconds=2.0)
    assert pickle.loads(pickle.dumps(options)) == options


def test_traceback_names_the_public_class() -> None:
    code = "import asyncreplica as ar\nraise ar.ReplicaContextError('boom')\n"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert "\nasyncreplica.ReplicaContextError: boom\n" in proc.stderr
