"""The numpy backend: replicas' values are numpy arrays on the CPU.

Registered as ``numpy`` under the ``asyncreplica.backends`` entry point; it is the
default backend for CPU devices.
"""

from __future__ import annotations

from ._backend import NumpyBackend

__all__ = ["NumpyBackend"]
