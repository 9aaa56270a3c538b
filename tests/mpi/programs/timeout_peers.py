"""A process that times out tells the others, who raise at once (``mpiexec -n 3``).

Usage: ``mpiexec -n 3 python timeout_peers.py``. Process 2 is busy (3 s) before its
collective; processes 0 and 1 wait for it with ``timeout_seconds=0.5``, process 1 having
arrived 0.3 s later than process 0, so process 0 times out first. Process 1 must raise
at once with process 0's cause (not be ended by process 0's exit hook before it can
report anything), and so must process 2 when it arrives. Each rank logs ``raised
<Type>`` and the message; the job is then ended (the processes are out of step).

With the argument ``named``, each replica issues two named collectives at once, from a
task group of its own: the second fails only because the first timed out (the processes
are out of step), so each process must still raise the one error, never a group.
"""

from __future__ import annotations

import functools
import sys
import time

import anyio
import numpy as np
from _report import RANK, report

import asyncreplica as ar


async def step() -> None:
    if RANK == 1:
        await anyio.sleep(0.3)
    if RANK == 2:
        time.sleep(3.0)  # noqa: ASYNC251 -- busy: blocks its loop, as a long computation would
    ctx = ar.get_replica_context()
    assert ctx is not None
    if sys.argv[1:] == ["named"]:
        async with anyio.create_task_group() as tg:
            for name in ("a", "b"):
                tg.start_soon(functools.partial(ctx.all_reduce, "SUM", np.ones(3), name=name))
        return
    await ctx.all_reduce("SUM", np.ones(3))


async def main() -> None:
    options = ar.CommunicationOptions(timeout_seconds=0.5)
    strategy = ar.MultiWorkerMirroredStrategy(["CPU:0"], communication_options=options)
    try:
        await strategy.run(step)
    except Exception as exc:
        report(f"raised {type(exc).__name__}")
        report(str(exc))
    else:
        report("finished")


if __name__ == "__main__":
    anyio.run(main)
