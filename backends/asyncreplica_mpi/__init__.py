"""Scale-out over MPI: the process group and backend of ``MultiWorkerMirroredStrategy``.

Installed with ``pip install "asyncreplica[mpi]"`` (mpi4py and the MPICH wheel). The
strategy loads this package when it is created; importing it does not import mpi4py.

* :class:`MPIProcessGroup`: the processes' agreement on every collective (a compact
  fingerprint per position; one JSON detail per process when they disagree).
* :class:`MPIBackend`: a local backend's results combined across processes with
  non-blocking MPI collectives polled from the event loop.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MPIBackend", "MPIProcessGroup", "mpi_info"]


def __getattr__(name: str) -> Any:
    if name == "MPIProcessGroup":
        from ._group import MPIProcessGroup

        return MPIProcessGroup
    if name == "MPIBackend":
        from ._backend import MPIBackend

        return MPIBackend
    raise AttributeError(f"module 'asyncreplica_mpi' has no attribute {name!r}")


def mpi_info() -> dict[str, Any]:
    """What ``asyncreplica doctor`` reports about MPI, without initialising it twice.

    Returns:
        ``{"available": False, "error": ...}`` when mpi4py cannot be imported, else the
        MPI library's version line, the world size and rank, and the thread level.
    """
    try:
        from mpi4py import MPI
    except Exception as exc:  # ImportError, or a broken MPI library
        return {"available": False, "error": f"{type(exc).__name__}: {exc}"}
    levels = {
        MPI.THREAD_SINGLE: "single",
        MPI.THREAD_FUNNELED: "funneled",
        MPI.THREAD_SERIALIZED: "serialized",
        MPI.THREAD_MULTIPLE: "multiple",
    }
    return {
        "available": True,
        "library": MPI.Get_library_version().strip().splitlines()[0],
        "world_size": MPI.COMM_WORLD.Get_size(),
        "rank": MPI.COMM_WORLD.Get_rank(),
        "thread_level": levels.get(MPI.Query_thread(), str(MPI.Query_thread())),
    }
