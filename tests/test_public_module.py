"""Public classes name ``asyncreplica`` as their module, as trio's do (issue 16).

A traceback prints ``asyncreplica.ReplicaExitedError: ...``, the name a user imports, not
the private module that defines the class.
"""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

import asyncreplica as ar

CLASSES = [name for name in ar.__all__ if isinstance(getattr(ar, name), type)]


def test_there_are_public_classes() -> None:
    assert {"ReplicaExitedError", "MirroredStrategy", "PerReplica", "ReduceOp"} <= set(CLASSES)


@pytest.mark.parametrize("name", CLASSES)
def test_public_class_module_is_asyncreplica(name: str) -> None:
    cls = getattr(ar, name)
    assert cls.__module__ == "asyncreplica"
    assert f"{cls.__module__}.{cls.__qualname__}" == f"asyncreplica.{name}"


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
