"""Plain (non-distributed) values in cross-replica calls across processes (under mpiexec).

Usage: ``mpiexec -n P python plain.py K`` where ``K`` is each process's replica count:
one number for every process (``2``), or one per process (``2,1``). Logs one line per
call: its result as a list, or the class of the error it raised.
"""

from __future__ import annotations

import sys

import anyio
import numpy as np
from _report import RANK, report

import asyncreplica as ar


async def attempt(what: str, call: object) -> None:
    try:
        result = await call  # type: ignore[misc]
    except Exception as error:  # logged for the test
        report(f"{what} raised {type(error).__name__}")
    else:
        report(f"{what} {np.asarray(result).tolist()}")


async def main(counts: list[int]) -> None:
    local = counts[RANK] if len(counts) > 1 else counts[0]
    strategy = ar.MultiWorkerMirroredStrategy([f"CPU:{i}" for i in range(local)])
    await attempt("mean", strategy.reduce("MEAN", np.array(0.5), axis=None))
    await attempt("max", strategy.reduce("MAX", np.array(float(RANK)), axis=None))
    await attempt("reduce_to", strategy.extended.reduce_to("MEAN", np.array(0.5), "CPU:0"))
    # refused by the local backend's rules, on every process, before any data moves
    await attempt("bool", strategy.reduce("MAX", np.ones(2, bool), axis=None))

    async def merge_fn(s: ar.Strategy) -> object:
        return await s.reduce("MEAN", np.array(2.0), axis=None)

    async def step() -> object:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.merge_call(merge_fn)

    merged = await strategy.run(step)
    report(f"merge {np.asarray(strategy.experimental_local_results(merged)[0]).tolist()}")
    rows = await strategy.run(
        lambda: np.full((2, 3), ar.get_replica_context().replica_id_in_sync_group)
    )
    await attempt("gather", strategy.gather(rows, axis=0))
    await attempt("sum", strategy.reduce("SUM", np.array(1.0), axis=None))
    # run's results (with one replica per process, plain: that replica's values)
    ids = await strategy.run(
        lambda: np.array(float(ar.get_replica_context().replica_id_in_sync_group))
    )
    await attempt("max_run", strategy.reduce("MAX", ids, axis=None))
    await attempt("sum_run", strategy.reduce("SUM", ids, axis=None))
    await attempt("sum_run_to", strategy.extended.reduce_to("SUM", ids, "CPU:0"))

    async def merge_sum(s: ar.Strategy, mine: object) -> list[str]:
        # merge_call's argument is this replica's value; a constant is one value
        out = []
        for value in (mine, 0.5):
            try:
                out.append(str(np.asarray(await s.reduce("SUM", value, axis=None)).tolist()))
            except ValueError as error:
                out.append(f"raised {type(error).__name__}")
        return out

    async def sum_step() -> object:
        ctx = ar.get_replica_context()
        assert ctx is not None
        mine = np.array(float(ctx.replica_id_in_sync_group))
        return await ctx.merge_call(merge_sum, args=(mine,))

    sums = strategy.experimental_local_results(await strategy.run(sum_step))[0]
    report(f"merge_sum {' '.join(sums)}")
    report(
        f"bcast {np.asarray(await strategy.extended.broadcast_to(np.ones(2), 'CPU:0')).tolist()}"
    )
    # A plain value reduced along an axis that differs per process: one process's
    # replicas disagree (CollectiveMismatchError), so every process raises it, whatever
    # the layout (before, with several replicas everywhere each returned its own shape).
    block = np.arange(24.0).reshape(2, 3, 4)
    await attempt("axes", strategy.reduce("MEAN", block, axis=RANK % 2))
    await attempt("axes_after", strategy.reduce("MEAN", block, axis=0))
    report("done")


if __name__ == "__main__":
    anyio.run(main, [int(k) for k in sys.argv[1].split(",")])
