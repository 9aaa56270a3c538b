"""Processes whose exchanges are out of step say so at once (run under mpiexec).

Usage: ``mpiexec -n P python out_of_step.py``. The last process skips one exchange
number (simulating a process that made one exchange more than the others, the way a
collective queued behind a failed run's last exchange once did). The next collective
must raise the same ``BackendError`` on every process, naming the out-of-step
exchanges, never a false "Processes disagree" mismatch. Each rank logs ``raised <Type>``
and the message, then the job is ended by the exit hook (the processes are out of step).
"""

from __future__ import annotations

import anyio
import numpy as np
from _report import RANK, report
from mpi4py import MPI

import asyncreplica as ar

SIZE = MPI.COMM_WORLD.Get_size()


async def step() -> None:
    await ar.get_replica_context().all_reduce("SUM", np.ones(3))


async def main() -> None:
    strategy = ar.MultiWorkerMirroredStrategy(["CPU:0"])
    await strategy.run(step)  # in step
    if RANK == SIZE - 1:
        strategy._group._number += 1  # type: ignore[union-attr]
    try:
        await strategy.run(step)
    except Exception as exc:
        report(f"raised {type(exc).__name__}")
        report(str(exc))
    else:
        report("finished")
    MPI.COMM_WORLD.Barrier()  # every rank has logged before the exit hook ends the job


if __name__ == "__main__":
    anyio.run(main)
