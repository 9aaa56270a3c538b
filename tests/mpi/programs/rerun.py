"""After a failed run, the strategy's next run starts in step (run under mpiexec).

Usage: ``mpiexec -n P python rerun.py``. Each failed run below leaves a collective of
process 0 queued behind the exchange that fails the run (two named collectives issued
at once): that queued collective must not make an exchange of its own, or it pairs
with the other processes' next run. Each failed run is followed by a correct run on the
same strategy, whose values are checked. Logs ``ok <case>`` per case, then ``done``.
"""

from __future__ import annotations

import functools

import anyio
import numpy as np
from _report import RANK, report
from mpi4py import MPI

import asyncreplica as ar

SIZE = MPI.COMM_WORLD.Get_size()


async def both_named() -> None:
    """Process 0 issues two named collectives at once (one queues behind the other)."""
    ctx = ar.get_replica_context()
    assert ctx is not None
    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(ctx.all_reduce, "SUM", np.ones(2), name="x"))
        tg.start_soon(functools.partial(ctx.all_reduce, "SUM", np.ones(2), name="y"))


async def raises() -> None:
    if RANK == 0:
        await both_named()
    raise ValueError("process fails before its collectives")


async def finishes() -> None:
    if RANK == 0:
        await both_named()


async def mismatch() -> None:
    ctx = ar.get_replica_context()
    assert ctx is not None
    if RANK == 0:
        await both_named()
    else:
        await ctx.all_reduce("SUM", np.ones(3), name="x")


async def correct() -> tuple[float, float, float]:
    ctx = ar.get_replica_context()
    assert ctx is not None
    first = await ctx.all_reduce("SUM", np.float64(1.0))
    x = await ctx.all_reduce("SUM", np.ones(2), name="x")
    y = await ctx.all_reduce("MAX", np.full(2, float(RANK)), name="y")
    return float(first), float(x[0]), float(y[0])


async def main() -> None:
    strategy = ar.MultiWorkerMirroredStrategy(["CPU:0"])
    for case in (raises, finishes, mismatch, raises, mismatch, finishes):
        try:
            await strategy.run(case)
        except Exception as exc:  # every process fails the run, with its own error
            leaves = exc.exceptions if isinstance(exc, ExceptionGroup) else (exc,)
            if not all(isinstance(e, (ValueError, ar.CollectiveError)) for e in leaves):
                raise
        else:
            raise AssertionError(f"{case.__name__}: the run completed")
        for _ in range(2):
            got = strategy.experimental_local_results(await strategy.run(correct))
            assert got == ((float(SIZE), float(SIZE), float(SIZE - 1)),), got
        report(f"ok {case.__name__}")
    report("done")


if __name__ == "__main__":
    anyio.run(main)
