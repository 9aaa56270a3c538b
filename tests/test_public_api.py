"""The public surface: complete, sorted, documented, typed."""

from __future__ import annotations

import inspect
import pathlib

import asyncreplica as ar
import asyncreplica.abc
import asyncreplica.lint
import asyncreplica.testing

ROOT = pathlib.Path(__file__).resolve().parent.parent

DESIGN_NAMES = {
    "MirroredStrategy",
    "ReplicaContext",
    "get_replica_context",
    "in_cross_replica_context",
    "get_strategy",
    "has_strategy",
    "PerReplica",
    "Mirrored",
    "IndexedSlices",
    "ReduceOp",
    "CommunicationOptions",
    "CommunicationImplementation",
    "AsyncReplicaError",
    "CollectiveError",
    "CollectiveMismatchError",
    "ReplicaExitedError",
    "CollectiveTimeoutError",
    "ReplicaContextError",
    "BackendError",
    "BackendNotFoundError",
    "InternalError",
}


def test_all_is_sorted_and_complete() -> None:
    assert ar.__all__ == sorted(ar.__all__)
    # Submodules and pytest's assertion-rewriting helpers ("@py_builtins": the pytest
    # plugin this distribution ships makes pytest rewrite its modules) are not API.
    public = {
        n
        for n in dir(ar)
        if n.isidentifier()
        and not n.startswith("_")
        and n not in {"abc", "lint", "testing", "annotations"}
    }
    assert public - {"__version__"} <= set(ar.__all__)
    assert set(ar.__all__) - {"__version__"} <= public


def test_design_names_are_exported() -> None:
    assert set(ar.__all__) >= DESIGN_NAMES


def test_every_public_name_has_a_docstring() -> None:
    for module in (ar, asyncreplica.abc, asyncreplica.lint, asyncreplica.testing):
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                assert inspect.getdoc(obj), f"{module.__name__}.{name} has no docstring"
                if inspect.isclass(obj):
                    for attr, member in vars(obj).items():
                        if not attr.startswith("_") and (
                            inspect.isfunction(member) or isinstance(member, property)
                        ):
                            assert inspect.getdoc(member), f"{name}.{attr} has no docstring"


def test_error_tree() -> None:
    assert issubclass(ar.CollectiveError, ar.AsyncReplicaError)
    assert issubclass(ar.CollectiveError, RuntimeError)
    for cls in (ar.CollectiveMismatchError, ar.ReplicaExitedError, ar.CollectiveTimeoutError):
        assert issubclass(cls, ar.CollectiveError)
    assert issubclass(ar.CollectiveTimeoutError, TimeoutError)
    assert issubclass(ar.ReplicaContextError, RuntimeError)
    assert issubclass(ar.BackendError, RuntimeError)
    assert issubclass(ar.BackendNotFoundError, LookupError)
    # A replica cancelled from outside its run is a failed run, as a collective error is.
    assert issubclass(ar.ReplicaCancelledError, ar.CollectiveError)
    # The library's own bugs: caught by `except AsyncReplicaError`, but by no handler
    # written for a collective's or a context's errors (no RuntimeError base).
    assert issubclass(ar.InternalError, ar.AsyncReplicaError)
    assert not issubclass(ar.InternalError, RuntimeError)


def test_package_is_typed() -> None:
    assert (ROOT / "asyncreplica/py.typed").exists()
    assert (ROOT / "backends/asyncreplica_numpy/py.typed").exists()
