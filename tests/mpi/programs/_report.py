"""Shared by the MPI test programs: one log file per rank, so output never interleaves."""

from __future__ import annotations

import os
import pathlib

from mpi4py import MPI

RANK = MPI.COMM_WORLD.Get_rank()
_OUT = os.environ.get("ASYNCREPLICA_TEST_OUT")


def report(line: str) -> None:
    """Print ``line`` and append it to ``$ASYNCREPLICA_TEST_OUT/rank<R>.log``."""
    print(f"rank={RANK} {line}", flush=True)
    if _OUT:
        with (pathlib.Path(_OUT) / f"rank{RANK}.log").open("a", encoding="utf-8") as f:
            f.write(line + "\n")
