"""Public test helpers for asyncreplica and for people who write backends.

A third-party backend proves that it honours :class:`asyncreplica.abc.Backend` by
inheriting the conformance suite in its own pytest tests (three lines)::

    from asyncreplica.testing import BackendConformanceTests
    class TestMyBackend(BackendConformanceTests):
        def make_backend(self, devices): return MyBackend(devices)

Importing this package imports pytest; ``import asyncreplica`` never does.
"""

from __future__ import annotations

from ._conformance import BackendConformanceTests as BackendConformanceTests

__all__ = ["BackendConformanceTests"]
