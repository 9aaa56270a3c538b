"""A run cancelled while its collective waits for another process (run under mpiexec).

Usage: ``mpiexec -n 2 python cancel.py KIND [asyncio|trio]``. Process 0 (2 replicas)
cancels its run while its replicas wait at their first collective for process 1 (1
replica), which starts late. Once posted, the exchange must complete: process 0 finishes
the collective, then its run ends cancelled, and process 1 sees process 0 fail at its
second collective. Both then run again: the processes are still in step.

KIND is the first collective: ``small`` (an all_reduce whose data travels with the
agreement), ``barrier``, ``large`` (1 MiB: the data moves after the agreement) or
``gather``.
"""

from __future__ import annotations

import sys

import anyio
import numpy as np
from _report import RANK, report

import asyncreplica as ar

KIND = sys.argv[1]
BACKEND = sys.argv[2] if len(sys.argv) > 2 else "asyncio"
LOCAL = 2 if RANK == 0 else 1

got: list[str] = []


async def first(ctx: ar.ReplicaContext) -> object:
    g = ctx.replica_id_in_sync_group
    if KIND == "small":
        return await ctx.all_reduce("SUM", np.full(2, g + 1, np.float32))
    if KIND == "large":
        return await ctx.all_reduce("SUM", np.full(1 << 17, g + 1, np.float64))
    if KIND == "gather":
        return await ctx.all_gather(np.full(1, g, np.int64), axis=0)
    return await ctx.barrier()


def summary(result: object) -> str:
    if result is None:
        return "none"
    array = np.asarray(result)
    return f"{array.min():g}-{array.max():g}/{array.size}"


async def step() -> None:
    ctx = ar.get_replica_context()
    assert ctx is not None
    got.append(summary(await first(ctx)))
    await ctx.all_reduce("SUM", np.ones(3))  # process 0's run is cancelled before this


async def ok() -> object:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return await ctx.all_reduce("SUM", np.float32(1))


async def main() -> None:
    strategy = ar.MultiWorkerMirroredStrategy([f"CPU:{i}" for i in range(LOCAL)])
    if RANK == 0:
        with anyio.move_on_after(0.3) as scope:
            await strategy.run(step)
        report(f"cancelled {scope.cancelled_caught}")
    else:
        await anyio.sleep(0.8)  # process 0's first collective waits for this one
        try:
            await strategy.run(step)
        except ar.ReplicaExitedError as exc:
            report("raised ReplicaExitedError")
            report(str(exc).splitlines()[0])
        else:
            report("finished")
    report(f"first {sorted(got)}")
    again = await strategy.run(ok)
    report(f"again {[float(v) for v in strategy.experimental_local_results(again)]}")


if __name__ == "__main__":
    anyio.run(main, backend=BACKEND)
