"""Bad programs across processes: each must raise on every process (run under mpiexec).

Usage: ``mpiexec -n 2 python scenarios.py NAME``. Each rank logs ``raised <Type>`` and
the message (see ``_report.py``), or ``finished`` when its run returned, and exits
with status 1 after an error.
"""

from __future__ import annotations

import asyncio
import logging
import sys

import anyio
import anyio.lowlevel
import numpy as np
from _report import RANK, report
from mpi4py import MPI

import asyncreplica as ar

SCENARIO = sys.argv[1]
# Process 0 runs 2 replicas, process 1 one; both run 2 in the scenarios named here.
LOCAL = 2 if RANK == 0 or SCENARIO in ("local_skip", "local_mismatch") else 1


async def skip() -> None:
    ctx = ar.get_replica_context()
    await ctx.all_reduce("SUM", np.ones(3))
    if RANK == 0:  # process 1 skips the second collective
        await ctx.all_reduce("SUM", np.ones(3))  # marker: skip


async def extra() -> None:
    ctx = ar.get_replica_context()
    await ctx.all_reduce("SUM", np.ones(3))
    if RANK == 1:  # process 1 issues one more
        await ctx.all_reduce("SUM", np.ones(3))  # marker: extra


async def shape() -> None:
    ctx = ar.get_replica_context()
    await ctx.all_reduce("SUM", np.ones(3 if RANK == 0 else 4))


async def array_type() -> None:
    # Process 1 passes an array_api_strict array, process 0 a numpy array.
    import array_api_strict as xp

    ctx = ar.get_replica_context()
    x = np.ones(3) if RANK == 0 else xp.ones(3, dtype=xp.float64)
    await ctx.all_reduce("SUM", x)


async def op() -> None:
    ctx = ar.get_replica_context()
    await ctx.all_reduce("SUM" if RANK == 0 else "MAX", np.ones(3))


async def callsite() -> None:
    ctx = ar.get_replica_context()
    if RANK == 0:
        await ctx.all_reduce("SUM", np.ones(3))  # marker: callsite-0
    else:
        await ctx.all_reduce("SUM", np.ones(3))  # marker: callsite-1


async def fails() -> None:
    ctx = ar.get_replica_context()
    await ctx.all_reduce("SUM", np.ones(3))
    if RANK == 1:
        raise ValueError("bad batch on process 1")
    await ctx.all_reduce("SUM", np.ones(3))


async def local() -> None:
    ctx = ar.get_replica_context()
    if ctx.replica_id_in_sync_group == 0:  # process 0's replicas disagree locally
        await ctx.all_reduce("SUM", np.ones(4))
    else:
        await ctx.all_reduce("SUM", np.ones(3))


async def local_skip() -> None:
    ctx = ar.get_replica_context()
    await ctx.all_reduce("SUM", np.ones(3))
    if ctx.replica_id_in_sync_group != 3:  # global replica 3 (process 1's 2nd) skips
        await ctx.all_reduce("SUM", np.ones(3))  # marker: local_skip


async def local_mismatch() -> None:
    ctx = ar.get_replica_context()
    await ctx.all_reduce("SUM", np.ones(3 if ctx.replica_id_in_sync_group != 3 else 4))


async def busy() -> None:
    ctx = ar.get_replica_context()
    if RANK == 1:
        # Busy for good: blocks until process 0's exit hook aborts the job.
        MPI.COMM_WORLD.recv(source=0, tag=99)
    await ctx.all_reduce("SUM", np.ones(3))


async def ok() -> float:
    ctx = ar.get_replica_context()
    return float(await ctx.all_reduce("SUM", 1.0))


STEPS = {
    "skip": skip,
    "extra": extra,
    "shape": shape,
    "array_type": array_type,
    "op": op,
    "callsite": callsite,
    "raise": fails,
    "raise_outside": ok,
    "timeout": busy,
    "local": local,
    "local_skip": local_skip,
    "local_mismatch": local_mismatch,
    "responsive": ok,
}


async def responsive(strategy: ar.MultiWorkerMirroredStrategy) -> None:
    """Process 1 joins only after process 0's other coroutine ran during the collective."""
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while ticks < 100:  # the loop keeps running while the collective waits
            ticks += 1
            await anyio.lowlevel.checkpoint()
        request = MPI.COMM_WORLD.isend(ticks, dest=1, tag=7)
        while not request.Test():
            await anyio.lowlevel.checkpoint()

    if RANK == 0:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            result = await strategy.run(STEPS["responsive"])
        report(f"ticks {ticks}")
    else:
        # Blocks this process until process 0's ticker has run 100 times.
        report(f"got {MPI.COMM_WORLD.recv(source=0, tag=7)}")
        result = await strategy.run(STEPS["responsive"])
    report(f"result {strategy.experimental_local_results(result)[0]}")


async def late() -> float:
    ctx = ar.get_replica_context()
    if RANK == 1:
        # Late for good reasons: until process 0 has warned that it waits for us.
        report(f"released by {MPI.COMM_WORLD.recv(source=0, tag=8)}")
    return float(await ctx.all_reduce("SUM", 1.0))


STEPS.update(late=late, construct=ok)


class _Released(logging.Handler):
    """On process 0: log warnings to the rank log; release process 1 at the stall one."""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        report(f"warning: {message}")
        if RANK == 0 and "stalled" in message:
            MPI.COMM_WORLD.send("the stall warning", dest=1, tag=8)


async def transfer_fails(n: int) -> None:
    """Process 1 fails inside its data transfer, after the processes agreed."""
    if RANK == 1:
        from asyncreplica_mpi import MPIBackend

        async def refuse(self: object, *args: object, **kwargs: object) -> None:
            raise TypeError("simulated: mpi4py refused the buffer")

        MPIBackend._move = refuse  # type: ignore[method-assign]

    async def step() -> None:
        await ar.get_replica_context().all_reduce("SUM", np.ones(n))  # marker: transfer

    return step  # type: ignore[return-value]


async def concurrent(strategy: ar.MultiWorkerMirroredStrategy) -> None:
    """Two runs of one strategy at once: the second is refused, the first completes."""

    async def second() -> float:
        return float(await ar.get_replica_context().all_reduce("SUM", 2.0))

    first, refused = await asyncio.gather(
        strategy.run(STEPS["responsive"]), strategy.run(second), return_exceptions=True
    )
    report(f"first {strategy.experimental_local_results(first)}")
    assert isinstance(refused, BaseException), refused
    raise refused


_release_after_report: list[bool] = []


async def main() -> None:
    logging.getLogger("asyncreplica").addHandler(_Released())
    options = ar.CommunicationOptions(timeout_seconds=0.5) if SCENARIO == "timeout" else None
    if SCENARIO in ("transfer_timeout", "construct"):
        options = ar.CommunicationOptions(timeout_seconds=30 if SCENARIO != "construct" else 1)
    if SCENARIO == "construct" and RANK == 1:
        # Never creates the strategy: waits until process 0 has given up on it.
        report(f"released by {MPI.COMM_WORLD.recv(source=0, tag=9)}")
        return
    try:
        strategy = ar.MultiWorkerMirroredStrategy(
            [f"CPU:{i}" for i in range(LOCAL)],
            communication_options=options,
            stall_warning_seconds=0.3 if SCENARIO in ("late", "construct") else 30.0,
        )
    finally:
        if SCENARIO == "construct":
            # Released once process 0 has logged its error (below), so that process 1's
            # exit cannot end process 0 before then.
            _release_after_report.append(True)
    if SCENARIO.startswith("transfer"):
        # 800 KB moves polled from the loop, 2.4 MB in a worker thread.
        size = 300_000 if SCENARIO == "transfer_thread" else 100_000
        await strategy.run(await transfer_fails(size))
        report("finished")
        return
    if SCENARIO == "responsive":
        await responsive(strategy)
        report("finished")
        return
    if SCENARIO == "raise_outside" and RANK == 1:
        raise ValueError("process 1 crashed before its run")
    if SCENARIO == "concurrent":
        await concurrent(strategy)
    await strategy.run(STEPS[SCENARIO])
    report("finished")


if __name__ == "__main__":
    try:
        anyio.run(main)
    except Exception as exc:
        report(f"raised {type(exc).__name__}")
        report(str(exc))
        for note in getattr(exc, "__notes__", ()):
            report(note)
        attrs = {
            name: sorted(value) if isinstance(value, frozenset | dict) else value
            for name in ("replica_id", "position", "name", "waiting", "signatures")
            if (value := getattr(exc, name, None)) is not None
        }
        rows = getattr(getattr(exc, "report", None), "rows", None)
        if rows is not None:
            attrs["report"] = [row.replica_id for row in rows]
        report(f"attributes {attrs}")
        if _release_after_report:
            MPI.COMM_WORLD.send("process 0's error", dest=1, tag=9)
        if SCENARIO == "raise_outside" and RANK == 1:
            raise  # uncaught: the goodbye at exit tells the other process
        sys.exit(1)
