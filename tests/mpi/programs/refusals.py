"""Cross-replica calls whose values one process cannot take (under mpiexec).

Usage: ``mpiexec -n P python refusals.py K`` (``K``: each process's replica count). The
last replica holds a value the others do not (a str array, a bool array):
one process raises its error for the whole call, so every process must raise that
error's class (never a ``ReplicaExitedError`` on the others). Logs ``CASE CLASS`` per
case, then ``done`` (the strategy is still usable: a last gather crosses).
"""

from __future__ import annotations

import sys

import anyio
import numpy as np
from _report import report
from mpi4py import MPI

import asyncreplica as ar

TOTAL = MPI.COMM_WORLD.Get_size() * int(sys.argv[1])
LAST = TOTAL - 1
CASES = {
    "str_gather": (lambda g: np.array(["a", "b"]) if g == LAST else np.ones(2), "gather"),
    "str_reduce": (lambda g: np.array(["a", "b"]) if g == LAST else np.ones(2), "reduce"),
    "bool_reduce": (lambda g: np.ones(2, bool) if g == LAST else np.ones(2), "reduce"),
    "bool_reduce_to": (lambda g: np.ones(2, bool) if g == LAST else np.ones(2), "reduce_to"),
}


async def main(k: int) -> None:
    strategy = ar.MultiWorkerMirroredStrategy([f"CPU:{i}" for i in range(k)])
    for case, (make, call) in CASES.items():
        value = await strategy.run(
            lambda m=make: m(ar.get_replica_context().replica_id_in_sync_group)
        )
        try:
            if call == "gather":
                await strategy.gather(value, axis=0)
            elif call == "reduce":
                await strategy.reduce("SUM", value, axis=None)
            else:
                await strategy.extended.reduce_to("SUM", value, "CPU:0")
            report(f"{case} None")
        except Exception as error:  # logged for the test
            report(f"{case} {type(error).__name__}")
    rows = await strategy.run(lambda: np.ones((1, 2)))
    report(f"gather {np.asarray(await strategy.gather(rows, axis=0)).shape}")
    report("done")


if __name__ == "__main__":
    anyio.run(main, int(sys.argv[1]))
