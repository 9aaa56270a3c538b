"""The numpy backend: replicas' values are numpy arrays on the CPU.

Registered as ``numpy`` under the ``asyncreplica.backends`` entry point; it is the
default backend for CPU devices.
"""

from __future__ import annotations

from asyncreplica._public import set_public_module

from ._backend import NumpyBackend

__all__ = ["NumpyBackend"]


set_public_module(__name__, globals(), __all__)
del set_public_module
