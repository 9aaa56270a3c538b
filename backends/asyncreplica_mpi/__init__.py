"""Scale-out over MPI: the process group and backend of ``MultiWorkerMirroredStrategy``.

Installed with ``pip install "asyncreplica[mpi]"`` (mpi4py and the MPICH wheel). The
strategy loads this package when it is created; importing it does not import mpi4py.

* :class:`MPIProcessGroup`: the processes' agreement on every collective (a compact
  fingerprint per position; one JSON detail per process when they disagree).
* :class:`MPIBackend`: a local backend's results combined across processes, without
  blocking the event loop (small transfers polled from it, large ones waited for in a
  worker thread).
"""

from __future__ import annotations

from typing import Any

__all__ = ["MPIBackend", "MPIProcessGroup"]


def __getattr__(name: str) -> Any:
    if name == "MPIProcessGroup":
        from ._group import MPIProcessGroup

        return MPIProcessGroup
    if name == "MPIBackend":
        from ._backend import MPIBackend

        return MPIBackend
    raise AttributeError(f"module 'asyncreplica_mpi' has no attribute {name!r}")
