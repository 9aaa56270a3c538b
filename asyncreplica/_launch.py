"""Where MPI's launcher is and whether it started this process (for the CLI, doctor, bench).

Plain environment and file-system look-ups: nothing here imports mpi4py or starts MPI.
"""

from __future__ import annotations

import os
import shutil
import sys

__all__ = ["LAUNCHER_VARIABLES", "find_mpiexec", "launched_by_mpiexec", "watch"]

#: Environment variables that MPI launchers (MPICH's hydra, Open MPI, PMIx) set in
#: every process they start.
LAUNCHER_VARIABLES = ("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK")


def launched_by_mpiexec() -> bool:
    """Whether an MPI launcher started this process."""
    return any(v in os.environ for v in LAUNCHER_VARIABLES)


def find_mpiexec() -> str | None:
    """Find ``mpiexec``: the MPICH wheel's, next to this interpreter, else one on ``PATH``.

    Returns:
        Its path, or None when there is none.
    """
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    return shutil.which("mpiexec", path=path)


_watching: list[bool] = []


def watch() -> None:
    """Under an MPI launcher: tell the other processes when this one ends early.

    Installed when asyncreplica is imported in a process an MPI launcher started. A
    process that dies of an uncaught exception before (or inside) the constructor of
    the strategy its peers create, or exits without creating it, would leave them
    waiting; the "mpi" process group (loaded through its entry point, only when MPI was
    initialised) tells them. Nothing is imported before it is needed.
    """
    if _watching or not launched_by_mpiexec():
        return
    _watching.append(True)
    import atexit

    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: object) -> None:
        _tell_group(value, exiting=False)
        previous(kind, value, tb)  # type: ignore[arg-type]

    sys.excepthook = hook
    atexit.register(_tell_group, None, exiting=True)
    if "mpi4py.MPI" in sys.modules:
        # MPI is in use already: a process that finalizes it before creating its
        # strategy tells its peers too (the group's finalize hook, installed now).
        _tell_group(None, exiting=False)


def _tell_group(error: BaseException | None, *, exiting: bool) -> None:
    """Hand ``error`` (or the exit) to the "mpi" process group, once MPI is in use."""
    if "mpi4py.MPI" not in sys.modules:
        return  # MPI never started here: the launcher sees this process's exit itself
    try:
        from ._registry import load_process_group_class

        group_class = load_process_group_class("mpi")
    except Exception:  # no MPI group installed: nothing to tell
        return
    ends = getattr(group_class, "process_ends", None)
    if callable(ends):
        ends(error, exiting=exiting)
