"""Plugin discovery: entry points read lazily, classes and load errors cached.

Two entry-point groups: ``asyncreplica.backends`` (where values live: numpy, CuPy) and
``asyncreplica.process_groups`` (how processes agree and move values between them:
MPI). The runtime names no plugin package; it asks this module for a name.
"""

from __future__ import annotations

import importlib.metadata
import threading
from typing import TYPE_CHECKING

from ._exceptions import BackendNotFoundError

if TYPE_CHECKING:
    from .abc import Backend, ProcessGroup

__all__ = [
    "available_backends",
    "available_process_groups",
    "load_backend_class",
    "load_process_group_class",
    "plugin_packages",
    "register_backend",
]

GROUP = "asyncreplica.backends"
PROCESS_GROUPS = "asyncreplica.process_groups"

_lock = threading.Lock()
_entry_points: dict[str, importlib.metadata.EntryPoint] | None = None
_classes: dict[str, type[Backend]] = {}
_registered: dict[str, type[Backend]] = {}
_load_errors: dict[str, BaseException] = {}


def _discover() -> dict[str, importlib.metadata.EntryPoint]:
    global _entry_points
    with _lock:
        if _entry_points is None:
            found = importlib.metadata.entry_points(group=GROUP)
            _entry_points = {ep.name: ep for ep in found}
        return _entry_points


def available_backends() -> tuple[str, ...]:
    """Return the names of every backend that is installed or registered, sorted.

    A name listed here may still fail to load; loading reports why.
    """
    return tuple(sorted({*_discover(), *_registered}))


def register_backend(name: str, cls: type[Backend], *, replace: bool = False) -> None:
    """Register a backend class under ``name`` at run time.

    Args:
        name: The name users pass as ``backend=``.
        cls: A subclass of :class:`asyncreplica.abc.Backend`.
        replace: Allow replacing a backend of the same name.

    Raises:
        TypeError: ``cls`` is not a ``Backend`` subclass.
        ValueError: ``name`` is taken and ``replace`` is False.
    """
    from .abc import Backend

    if not isinstance(cls, type) or not issubclass(cls, Backend):
        raise TypeError(
            f"register_backend needs a subclass of asyncreplica.abc.Backend, got {cls!r}"
        )
    if not isinstance(name, str) or not name:
        raise ValueError(f"a backend name must be a non-empty string, got {name!r}")
    if not replace and (name in _registered or name in _discover()):
        raise ValueError(
            f"a backend named {name!r} is already registered; pass replace=True to replace it"
        )
    _registered[name] = cls
    _classes.pop(name, None)
    _load_errors.pop(name, None)


def load_backend_class(name: str) -> type[Backend]:
    """Return the backend class registered under ``name``, loading it if needed.

    Raises:
        BackendNotFoundError: No such backend, or it failed to load (the cause is kept).
    """
    from .abc import Backend

    if name in _registered:
        return _registered[name]
    if name in _classes:
        return _classes[name]
    if name in _load_errors:
        cause = _load_errors[name]
        raise BackendNotFoundError(name, available_backends(), cause) from cause
    entry = _discover().get(name)
    if entry is None:
        raise BackendNotFoundError(name, available_backends())
    try:
        cls = entry.load()
        if not isinstance(cls, type) or not issubclass(cls, Backend):
            raise TypeError(f"entry point {entry.value!r} is not a subclass of Backend")
    except Exception as exc:  # any import failure of a plugin is reported, never swallowed
        _load_errors[name] = exc
        raise BackendNotFoundError(name, available_backends(), exc) from exc
    _classes[name] = cls
    return cls


_group_entry_points: dict[str, importlib.metadata.EntryPoint] | None = None
_group_classes: dict[str, type[ProcessGroup]] = {}


def _discover_groups() -> dict[str, importlib.metadata.EntryPoint]:
    global _group_entry_points
    with _lock:
        if _group_entry_points is None:
            found = importlib.metadata.entry_points(group=PROCESS_GROUPS)
            _group_entry_points = {ep.name: ep for ep in found}
        return _group_entry_points


def plugin_packages() -> frozenset[str]:
    """Return the top-level packages of every installed plugin (backends, process groups).

    These ship with asyncreplica or beside it: their frames are the library's, not the
    user's (see ``_runtime/_traceback``). Nothing is imported to answer.
    """
    found = [*_discover().values(), *_discover_groups().values()]
    return frozenset(ep.value.partition(":")[0].partition(".")[0] for ep in found)


def available_process_groups() -> tuple[str, ...]:
    """Return the names of every installed process group (``"mpi"``), sorted."""
    return tuple(sorted(_discover_groups()))


def load_process_group_class(name: str) -> type[ProcessGroup]:
    """Return the process group class registered under ``name`` (entry point), loaded.

    Raises:
        BackendNotFoundError: No such process group, or it failed to load (the cause,
            such as a missing mpi4py, is kept).
    """
    from .abc import ProcessGroup

    if name in _group_classes:
        return _group_classes[name]
    entry = _discover_groups().get(name)
    if entry is None:
        raise BackendNotFoundError(name, available_process_groups())
    try:
        cls = entry.load()
        if not isinstance(cls, type) or not issubclass(cls, ProcessGroup):
            raise TypeError(f"entry point {entry.value!r} is not a subclass of ProcessGroup")
    except Exception as exc:  # any import failure of a plugin is reported, never swallowed
        raise BackendNotFoundError(name, available_process_groups(), exc) from exc
    _group_classes[name] = cls
    return cls
