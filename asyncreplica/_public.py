"""Public classes name the module users import them from."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["set_public_module"]


def set_public_module(package: str, namespace: Mapping[str, object], names: Iterable[str]) -> None:
    """Make each class in ``names`` defined below ``package`` say ``package`` is its module.

    Tracebacks, ``repr`` and ``help()`` then print ``asyncreplica.ReplicaExitedError``
    instead of ``asyncreplica._exceptions.ReplicaExitedError``. Pickling still works: it
    finds a class by ``__module__`` and ``__qualname__``, and both name it in ``package``.

    Args:
        package: The public package's ``__name__``.
        namespace: Its ``globals()``.
        names: Its ``__all__``.
    """
    for name in names:
        obj = namespace[name]
        if isinstance(obj, type) and obj.__module__.startswith(package + "."):
            obj.__module__ = package
