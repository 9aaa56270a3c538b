"""Public test helpers for asyncreplica and for people who write backends.

A third-party backend proves that it honours :class:`asyncreplica.abc.Backend` by
inheriting the conformance suite in its own pytest tests (three lines)::

    from asyncreplica.testing import BackendConformanceTests
    class TestMyBackend(BackendConformanceTests):
        def make_backend(self, devices): return MyBackend(devices)

``BackendConformanceTests`` needs pytest, which is imported when the name is first
used; ``import asyncreplica`` and ``import asyncreplica.testing`` never import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._conformance import BackendConformanceTests as BackendConformanceTests

__all__ = ["BackendConformanceTests"]


def __getattr__(name: str) -> object:
    if name == "BackendConformanceTests":
        from ._conformance import BackendConformanceTests

        return BackendConformanceTests
    raise AttributeError(f"module 'asyncreplica.testing' has no attribute {name!r}")
