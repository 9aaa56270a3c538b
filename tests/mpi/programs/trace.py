"""``strategy.trace(path)`` under MPI: rank 0 writes one merged file (run under mpiexec)."""

from __future__ import annotations

import sys

import anyio
import numpy as np
from _report import RANK, report

import asyncreplica as ar


async def step() -> None:
    ctx = ar.get_replica_context()
    for _ in range(3):
        await ctx.all_reduce("SUM", np.ones(4))


async def main() -> None:
    strategy = ar.MultiWorkerMirroredStrategy([f"CPU:{i}" for i in range(RANK + 1)])
    with strategy.trace(sys.argv[1]):
        await strategy.run(step)
    report("traced")


if __name__ == "__main__":
    anyio.run(main)
