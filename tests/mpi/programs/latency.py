"""How soon a fault in one process reaches the others (run under mpiexec).

Usage: ``mpiexec -n P python latency.py KIND [far]``. The last rank makes the fault; every
other rank waits at a collective for it and must raise. Each rank logs ``fault T`` (the
faulty rank, just before the fault) or ``error T TYPE`` (the others, when their run
raised), T in ``time.time_ns()`` (one clock: the processes share one machine).

Kinds: ``skip`` (the faulty rank returns one collective early), ``swap`` (it issues
two collectives in swapped order), ``mismatch`` (another shape), ``raise`` (a replica
raises), ``exit`` (the process exits between two runs: its exit hook tells the
others), ``transfer`` (it fails inside a data transfer, after the agreement).
"""

from __future__ import annotations

import sys
import time

import anyio
import numpy as np
from _report import report
from mpi4py import MPI

import asyncreplica as ar

KIND = sys.argv[1]
# "far": every timer of the wait (sleeps between tests, reading notes, announcing a
# wait, stall warnings, the failed process's grace for acknowledgements) is set far
# beyond the test's hang guard, and waits park at once (no spin): an error that still
# arrives was delivered by MPI itself, not by a timer firing.
FAR = sys.argv[2:] == ["far"]
if FAR:
    from asyncreplica_mpi import _waiting

    _waiting._SPIN_SECONDS = 0.0
    _waiting._MIN_SLEEP = _waiting._MAX_SLEEP = 1e4
    _waiting._NOTES_SECONDS = _waiting._ANNOUNCE_SECONDS = _waiting._ACK_SECONDS = 1e4
RANK = MPI.COMM_WORLD.Get_rank()
FAULTY = MPI.COMM_WORLD.Get_size() - 1


def fault() -> None:
    report(f"fault {time.time_ns()}")


async def helper(ctx: ar.ReplicaContext, x: object) -> object:
    return await ctx.all_reduce("SUM", x)


async def step() -> None:
    ctx = ar.get_replica_context()
    assert ctx is not None
    await ctx.all_reduce("SUM", np.ones(3))
    faulty = RANK == FAULTY
    if faulty and KIND == "skip":
        fault()
        return
    if faulty and KIND == "swap":
        fault()
        await helper(ctx, np.ones(3))  # the same collective, from the other call path
        await ctx.all_reduce("SUM", np.ones(3))
        return
    if faulty and KIND == "mismatch":
        fault()
        await ctx.all_reduce("SUM", np.ones(4))
        return
    if faulty and KIND == "raise":
        fault()
        raise ValueError("a replica failed")
    if KIND == "transfer":
        await ctx.all_reduce("SUM", np.ones(100_000))
        return
    await ctx.all_reduce("SUM", np.ones(3))
    await helper(ctx, np.ones(3))


async def main() -> None:
    strategy = ar.MultiWorkerMirroredStrategy(
        ["CPU:0", "CPU:1"], stall_warning_seconds=1e4 if FAR else 30.0
    )
    if KIND == "transfer" and RANK == FAULTY:
        from asyncreplica_mpi import MPIBackend

        async def refuse(self: object, *args: object, **kwargs: object) -> None:
            fault()
            raise TypeError("simulated transfer failure")

        MPIBackend._move = refuse  # type: ignore[method-assign]
    if KIND == "exit":
        await strategy.run(step)
        if RANK == FAULTY:
            fault()
            sys.exit(0)  # between two runs: the exit hook tells the others
    try:
        await strategy.run(step)
    except Exception as exc:
        if RANK != FAULTY:
            report(f"error {time.time_ns()} {type(exc).__name__}")
            report(str(exc).splitlines()[0])
        raise
    report("finished")


if __name__ == "__main__":
    try:
        anyio.run(main)
    except Exception:
        sys.exit(1)
