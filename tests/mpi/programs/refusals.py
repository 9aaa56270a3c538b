"""Cross-replica calls whose values one process cannot take (under mpiexec).

Usage: ``mpiexec -n P python refusals.py K`` (``K``: each process's replica count). The
last replica holds a value the others do not (a str array, a bool array):
one process raises its error for the whole call, so every process must raise that
error's class (never a ``ReplicaExitedError`` on the others). Logs ``CASE CLASS`` per
case, then ``done`` (the strategy is still usable: a last gather crosses).
"""

from __future__ import annotations

import sys
import warnings

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
    # inf - inf under np.errstate(all="raise"): in one process's own combine at k=2
    "fp_raise": (lambda g: np.full(2, np.inf if g == 0 else -np.inf if g == 1 else 0.0), "raise"),
    # MIN along an axis where replica 1 has no rows: the runtime's ValueError naming it
    "empty_min": (lambda g: np.ones((0 if g == 1 else 2, 3)), "min0"),
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
            elif call == "raise":
                with np.errstate(all="raise"):
                    await strategy.reduce("SUM", value, axis=None)
            elif call == "min0":
                await strategy.reduce("MIN", value, axis=0)
            else:
                await strategy.extended.reduce_to("SUM", value, "CPU:0")
            report(f"{case} None")
        except Exception as error:  # logged for the test
            detail = f": {str(error)[:42]}" if case == "empty_min" else ""
            report(f"{case} {type(error).__name__}{detail}")
    # MEAN along an axis of no rows anywhere: NaN, silently, as in one process
    empty = await strategy.run(lambda: np.ones((0, 3)) + 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mean = await strategy.reduce("MEAN", empty, axis=0)
    report(f"empty_mean {mean.tolist()} warnings={len(caught)}")
    rows = await strategy.run(lambda: np.ones((1, 2)))
    report(f"gather {np.asarray(await strategy.gather(rows, axis=0)).shape}")
    report("done")


if __name__ == "__main__":
    anyio.run(main, int(sys.argv[1]))
