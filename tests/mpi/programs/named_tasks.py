"""Named collectives issued from helper tasks on every process (run under mpiexec).

Usage: ``mpiexec -n P python named_tasks.py``. Process ``r`` runs 2 replicas. Even global
replicas await the named pair ``a`` then ``b``; odd ones start both in a task group (``b``
first) or with ``asyncio.gather``. No process may see a wait cycle: the tasks a replica
creates are watched under its local index on every process, not only on process 0 (whose
global ids are its local ones). Logs ``ok <mode>`` per mode, then ``done``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import numpy as np
from _report import report
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for random_programs

import random_programs as rp

import asyncreplica as ar

SIZE = MPI.COMM_WORLD.Get_size()
TOTAL = 2 * SIZE


async def main() -> None:
    strategy = ar.MultiWorkerMirroredStrategy(["CPU:0", "CPU:1"])
    for mode in ("taskgroup", "gather"):

        async def step(mode: str = mode) -> tuple[object, object]:
            ctx = ar.get_replica_context()
            assert ctx is not None
            rid = ctx.replica_id_in_sync_group
            await ctx.all_gather(np.ones((1, 2)), 0)
            return await rp.named_pair(ctx, 10, "seq_ab" if rid % 2 == 0 else mode, rid)

        for ra, rb in strategy.experimental_local_results(await strategy.run(step)):
            np.testing.assert_array_equal(ra, rp.expected_named(10, TOTAL, "a"))
            np.testing.assert_array_equal(rb, rp.expected_named(10, TOTAL, "b"))
        report(f"ok {mode}")
    report("done")


if __name__ == "__main__":
    anyio.run(main)
