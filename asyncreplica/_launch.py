"""Where MPI's launcher is and whether it started this process (for the CLI, doctor, bench).

Plain environment and file-system look-ups: nothing here imports mpi4py or starts MPI.
"""

from __future__ import annotations

import os
import shutil
import sys

__all__ = ["LAUNCHER_VARIABLES", "find_mpiexec", "launched_by_mpiexec"]

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
