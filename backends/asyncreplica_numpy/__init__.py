"""The numpy backend: replicas' values are numpy arrays on the CPU.

Registered as ``numpy`` under the ``asyncreplica.backends`` entry point; it is the
default backend for CPU devices.
"""

from __future__ import annotations

from ._backend import NumpyBackend

__all__ = ["NumpyBackend"]


def _set_public_module() -> None:
    """Name this package, where they are imported from, as its classes' module.

    Tracebacks, ``repr`` and ``help()`` then print the public name; pickle finds the
    classes here too.
    """
    namespace = globals()
    for name in __all__:
        obj = namespace[name]
        if isinstance(obj, type) and obj.__module__.startswith(__name__ + "."):
            obj.__module__ = __name__


_set_public_module()
