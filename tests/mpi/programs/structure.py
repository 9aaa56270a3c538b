"""Values whose structure differs between processes (under mpiexec).

Usage: ``mpiexec -n P python structure.py K`` (``K``: each process's replica count, one
for every process or one per process, ``2,1``). The last process's replicas return
``[x]`` where the others return ``{"a": x}``: one process's ``run`` raises regroup's
``ValueError``, so every process must raise it (never sum leaves of other keys). Logs
the error's class and first line, then the result of a run that follows (in step).
"""

from __future__ import annotations

import sys

import anyio
import numpy as np
from _report import RANK, report
from mpi4py import MPI

import asyncreplica as ar

LAST = MPI.COMM_WORLD.Get_size() - 1


async def main(counts: list[int]) -> None:
    local = counts[RANK] if len(counts) > 1 else counts[0]
    strategy = ar.MultiWorkerMirroredStrategy([f"CPU:{i}" for i in range(local)])
    x = np.arange(3.0)
    try:
        value = await strategy.run(lambda: {"a": x} if RANK != LAST else [x])
        report(f"run {value!r}")
        report(f"reduce {await strategy.reduce('SUM', value, axis=None)!r}")
    except ValueError as error:
        report(f"raised {type(error).__name__}: {str(error).splitlines()[0]}")
    after = await strategy.run(lambda: {"a": x + 0.0})  # one array per replica
    total = await strategy.reduce("SUM", after, axis=None)
    report(f"after {total['a'].tolist()}")
    report("done")


if __name__ == "__main__":
    anyio.run(main, [int(k) for k in sys.argv[1].split(",")])
