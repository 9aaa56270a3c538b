"""Backend discovery: entry points, names, install hints, load errors and registration."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest
from asyncreplica_numpy import NumpyBackend

import asyncreplica as ar
from asyncreplica import _registry
from asyncreplica.abc import Backend, available_backends, register_backend


@pytest.fixture(autouse=True)
def _restore_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Give each test copies of the registry's module state; the originals come back after."""
    entry_points = _registry._entry_points
    monkeypatch.setattr(
        _registry, "_entry_points", None if entry_points is None else dict(entry_points)
    )
    for attr in ("_classes", "_registered", "_load_errors"):
        monkeypatch.setattr(_registry, attr, dict(getattr(_registry, attr)))


class _Loads:
    """Counts how often the fake entry points were loaded."""

    count = 0


class _BrokenEntryPoint(importlib.metadata.EntryPoint):
    """An installed plugin whose import fails."""

    def load(self) -> object:
        _Loads.count += 1
        raise ImportError("No module named 'asyncreplica_broken_dependency'")


def _install_broken(monkeypatch: pytest.MonkeyPatch, name: str = "broken") -> None:
    entry = _BrokenEntryPoint(name, "asyncreplica_broken:BrokenBackend", _registry.GROUP)
    monkeypatch.setattr(_registry, "_entry_points", {**_registry._discover(), name: entry})
    _Loads.count = 0


class _OtherBackend(NumpyBackend):
    name = "other"


# Listing ----------------------------------------------------------------------------------------


def test_available_backends_lists_numpy() -> None:
    names = available_backends()
    assert "numpy" in names
    assert names == tuple(sorted(names))


def test_importing_asyncreplica_reads_no_entry_points() -> None:
    code = (
        "import asyncreplica, asyncreplica.abc, asyncreplica._registry as r\n"
        "assert r._entry_points is None, 'entry points were read at import time'\n"
        "assert 'asyncreplica_numpy' not in __import__('sys').modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_entry_points_are_read_on_first_lookup() -> None:
    _registry._entry_points = None  # the fixture restores both
    _registry._classes = {}
    assert _registry.load_backend_class("numpy") is NumpyBackend
    assert _registry._entry_points is not None
    assert "numpy" in _registry._entry_points


def test_registered_backends_are_listed() -> None:
    register_backend("other", _OtherBackend)
    assert "other" in available_backends()
    assert _registry.load_backend_class("other") is _OtherBackend


# Unknown names ----------------------------------------------------------------------------------


def test_unknown_name_is_backend_not_found_with_available_names() -> None:
    with pytest.raises(ar.BackendNotFoundError) as info:
        _registry.load_backend_class("no-such-backend")
    error = info.value
    assert isinstance(error, LookupError)
    assert error.name == "no-such-backend"
    assert "numpy" in error.available
    assert error.load_error is None
    assert "'numpy'" in str(error)
    assert "asyncreplica.backends" in str(error)  # how third-party backends register


@pytest.mark.parametrize(
    ("name", "hint"),
    # cupy is installed as an entry point now: tests/backends/gpu checks its hint.
    [("mpi", 'pip install "asyncreplica[mpi]"')],
)
def test_known_but_missing_backend_gets_an_install_hint(name: str, hint: str) -> None:
    with pytest.raises(ar.BackendNotFoundError) as info:
        _registry.load_backend_class(name)
    assert info.value.name == name
    assert hint in str(info.value)
    assert "numpy" in info.value.available


def test_strategy_reports_unknown_backend_with_hint() -> None:
    with pytest.raises(ar.BackendNotFoundError, match=r"asyncreplica\[mpi\]"):
        ar.MirroredStrategy(["CPU:0"], backend="mpi")


# register_backend -------------------------------------------------------------------------------


def test_register_duplicate_name_is_value_error() -> None:
    register_backend("other", _OtherBackend)
    with pytest.raises(ValueError, match=r"'other' is already registered.*replace=True"):
        register_backend("other", NumpyBackend)
    assert _registry.load_backend_class("other") is _OtherBackend


def test_register_over_an_entry_point_is_value_error() -> None:
    with pytest.raises(ValueError, match=r"'numpy' is already registered"):
        register_backend("numpy", _OtherBackend)
    assert _registry.load_backend_class("numpy") is NumpyBackend


def test_register_with_replace_replaces() -> None:
    register_backend("other", NumpyBackend)
    register_backend("other", _OtherBackend, replace=True)
    assert _registry.load_backend_class("other") is _OtherBackend
    register_backend("numpy", _OtherBackend, replace=True)
    assert _registry.load_backend_class("numpy") is _OtherBackend


def test_registry_state_is_restored_after_each_test() -> None:
    # Runs after the replace test above: the fixture must have undone it.
    assert "other" not in available_backends()
    assert _registry.load_backend_class("numpy") is NumpyBackend


@pytest.mark.parametrize(
    "cls",
    [object, NumpyBackend(["CPU:0"]), "asyncreplica_numpy:NumpyBackend", None, Backend.__init__],
    ids=["non-backend-class", "instance", "string", "None", "function"],
)
def test_register_non_backend_is_type_error(cls: object) -> None:
    with pytest.raises(TypeError, match=r"subclass of asyncreplica\.abc\.Backend"):
        register_backend("other", cls)  # type: ignore[arg-type]
    assert "other" not in available_backends()


@pytest.mark.parametrize("name", ["", None, 3], ids=["empty", "None", "int"])
def test_register_bad_name_is_value_error(name: object) -> None:
    with pytest.raises(ValueError, match=r"non-empty string"):
        register_backend(name, _OtherBackend)  # type: ignore[arg-type]


def test_registered_backend_is_usable_by_name() -> None:
    register_backend("other", _OtherBackend)
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"], backend="other")
    assert type(strategy.backend) is _OtherBackend


# Broken plugins ---------------------------------------------------------------------------------


def test_broken_entry_point_is_listed_but_fails_on_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    _install_broken(monkeypatch)
    assert "broken" in available_backends()
    with pytest.raises(ar.BackendNotFoundError) as info:
        _registry.load_backend_class("broken")
    error = info.value
    assert isinstance(error.load_error, ImportError)
    assert error.__cause__ is error.load_error
    assert error.name == "broken"
    assert "numpy" in error.available
    assert "installed but failed to load" in str(error)
    assert "asyncreplica_broken_dependency" in str(error)
    assert _Loads.count == 1


def test_broken_entry_point_error_is_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    _install_broken(monkeypatch)
    with pytest.raises(ar.BackendNotFoundError) as first:
        _registry.load_backend_class("broken")
    with pytest.raises(ar.BackendNotFoundError) as second:
        _registry.load_backend_class("broken")
    assert _Loads.count == 1, "the second lookup imported the plugin again"
    assert second.value.load_error is first.value.load_error


def test_cached_load_error_is_still_the_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    _install_broken(monkeypatch)
    with pytest.raises(ar.BackendNotFoundError):
        _registry.load_backend_class("broken")
    with pytest.raises(ar.BackendNotFoundError) as second:
        _registry.load_backend_class("broken")
    assert isinstance(second.value.load_error, ImportError)
    assert second.value.__cause__ is second.value.load_error


def test_broken_entry_point_does_not_affect_other_backends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _install_broken(monkeypatch)
    assert _registry.load_backend_class("numpy") is NumpyBackend
    assert _Loads.count == 0
    strategy = ar.MirroredStrategy(["CPU:0"])
    assert type(strategy.backend) is NumpyBackend


def test_strategy_reports_broken_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    _install_broken(monkeypatch)
    with pytest.raises(ar.BackendNotFoundError, match=r"'broken' is installed but failed to load"):
        ar.MirroredStrategy(["CPU:0"], backend="broken")


def test_entry_point_to_non_backend_is_backend_not_found(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = importlib.metadata.EntryPoint("odd", "asyncreplica:ReduceOp", _registry.GROUP)
    monkeypatch.setattr(_registry, "_entry_points", {**_registry._discover(), "odd": entry})
    with pytest.raises(ar.BackendNotFoundError) as info:
        _registry.load_backend_class("odd")
    assert isinstance(info.value.load_error, TypeError)
    assert info.value.__cause__ is info.value.load_error


def test_register_replaces_a_cached_load_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _install_broken(monkeypatch)
    with pytest.raises(ar.BackendNotFoundError):
        _registry.load_backend_class("broken")
    register_backend("broken", _OtherBackend, replace=True)
    assert _registry.load_backend_class("broken") is _OtherBackend


def test_process_groups_arrive_through_their_entry_point_group() -> None:
    from asyncreplica.abc import ProcessGroup

    assert "mpi" in _registry.available_process_groups()
    cls = _registry.load_process_group_class("mpi")
    assert issubclass(cls, ProcessGroup)
    assert cls.__module__.startswith("asyncreplica_mpi")
    with pytest.raises(ar.BackendNotFoundError, match=r"no backend named 'nope'"):
        _registry.load_process_group_class("nope")
