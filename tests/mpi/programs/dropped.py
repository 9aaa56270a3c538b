"""Strategies dropped on some processes and kept on others: the job still exits.

Usage: ``mpiexec -n P python dropped.py``. Each process creates three strategies in turn
and runs one step on each; process 0 keeps them, the others drop theirs (collected at
once), as happens when one process's exception traceback holds a strategy. The goodbye
at exit is an exchange on every strategy's group: every process must say it on each
one, or process 0 waits for the others for ever. Logs ``ok <k>``, then ``done``.
"""

from __future__ import annotations

import gc

import anyio
import numpy as np
from _report import RANK, report
from mpi4py import MPI

import asyncreplica as ar

SIZE = MPI.COMM_WORLD.Get_size()


async def step() -> float:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return float(await ctx.all_reduce("SUM", np.float64(1.0)))


async def main() -> None:
    kept = []
    for k in range(3):
        strategy = ar.MultiWorkerMirroredStrategy(["CPU:0"])
        got = strategy.experimental_local_results(await strategy.run(step))
        assert got == (float(SIZE),), got
        if RANK == 0:
            kept.append(strategy)
        del strategy
        gc.collect()
        report(f"ok {k}")
    report("done")


if __name__ == "__main__":
    anyio.run(main)
