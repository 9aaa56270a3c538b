"""Scale-out lifecycle and floating-point cases (run under mpiexec, 2 or 3 processes).

Usage: ``mpiexec -n 2 python scaleout.py <scenario> [args]``. Each scenario logs what
each process saw (one line per attempt); the test reads the logs. No scenario orders
events by sleeping; a hang guard dumps the stacks and exits.
"""

from __future__ import annotations

import asyncio
import os
import sys
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from _report import RANK, report
from mpi4py import MPI

import asyncreplica as ar

WORLD = MPI.COMM_WORLD


def said(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0]}"


class Stop(Exception):
    """A user's errcall raises this."""


def _stop(kind: str, flag: int) -> None:
    raise Stop(f"errcall: {kind}")


async def fp_settings(setting: str, case: str) -> None:
    """A float16 overflow under per-process floating-point settings, twice.

    ``setting``: ``split`` (process 0 ``over="raise"``, the others the default),
    ``call`` (a raising ``np.seterrcall`` on every process), ``werror`` (warnings as
    errors on every process). ``case``: ``reduce_mean`` (``strategy.reduce("MEAN")``,
    two exchanges), ``two_dtypes`` (a run's all_reduce of two large dtypes: two transfers).
    """
    if setting == "split" and RANK == 0:
        np.seterr(over="raise")
    elif setting == "call":
        np.seterrcall(_stop)
        np.seterr(over="call")
    elif setting == "werror":
        warnings.simplefilter("error")
    strategy = ar.MultiWorkerMirroredStrategy(stall_warning_seconds=10)
    n = 40000 if case == "two_dtypes" else 8

    async def values() -> object:
        return np.full(n, 60000.0, np.float16)

    async def two() -> object:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.all_reduce(
            "SUM", {"a": np.full(n, 60000.0, np.float16), "b": np.ones(n, np.float32)}
        )

    for attempt in range(2):
        try:
            if case == "reduce_mean":
                result = await strategy.reduce("MEAN", await strategy.run(values), axis=None)
            else:
                result = await strategy.run(two)
            report(f"{attempt} ok {type(result).__name__}")
        except Exception as error:
            report(f"{attempt} {said(error)}")
    # The strategy stays usable, in step.
    warnings.simplefilter("ignore")
    total = await strategy.reduce("SUM", await strategy.run(_one), axis=None)
    report(f"after {float(np.asarray(total).ravel()[0])}")


async def _one() -> object:
    return np.ones(1)


async def shared_op() -> None:
    """Two strategies' large float16 all_reduces at once: only A's values overflow."""
    np.seterr(over="raise")
    a = ar.MultiWorkerMirroredStrategy()
    b = ar.MultiWorkerMirroredStrategy()
    n = 300000

    def step(value: float) -> Callable[[], Awaitable[object]]:
        async def run() -> object:
            ctx = ar.get_replica_context()
            assert ctx is not None
            return await ctx.all_reduce("SUM", np.full(n, value, np.float16))

        return run

    for round_ in range(4):
        got = await asyncio.gather(a.run(step(60000.0)), b.run(step(1.0)), return_exceptions=True)
        seen = [
            said(g) if isinstance(g, BaseException) else f"ok {float(np.asarray(g)[0])}"
            for g in got
        ]
        report(f"{round_} A {seen[0]} | B {seen[1]}")


async def _sum_of_ids() -> object:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return await ctx.all_reduce("SUM", np.array([1.0 + ctx.replica_id_in_sync_group]))


async def _use(comm: MPI.Intracomm, devices: list[str] | None = None) -> list[float]:
    strategy = ar.MultiWorkerMirroredStrategy(devices, communicator=comm)
    result = await strategy.run(_sum_of_ids)
    return [float(np.asarray(r)[0]) for r in strategy.experimental_local_results(result)]


async def freed_comm(case: str) -> None:
    """A strategy on a communicator the program frees, then one on a new communicator.

    MPICH gives the new communicator the freed one's handle. ``reversed`` (2 processes):
    A = a Dup of COMM_WORLD, B = its ranks reversed, 1 and 2 replicas; ``subset`` (3):
    A = processes 0 and 1, B = a Dup of COMM_WORLD.
    """
    a = WORLD.Split(0 if case == "reversed" or RANK < 2 else MPI.UNDEFINED, RANK)
    if a != MPI.COMM_NULL:
        report(f"A {await _use(a)}")
        a.Free()
    if case == "reversed":
        b = WORLD.Split(0, -RANK)
        report(f"B {await _use(b, [f'CPU:{i}' for i in range(RANK + 1)])}")
    else:
        b = WORLD.Dup()
        report(f"B {await _use(b)}")
    b.Free()


async def end_interrupt(where: str = "run_end") -> None:
    """asyncio.run's first Ctrl-C on process 0 while it waits in a run's end exchange
    (``where="run_end"``) or in ``strategy.reduce``'s agreement (``"reduce"``).

    Process 0's replica returns at once; process 1's waits for process 0's go, which
    process 0 sends as it enters the wait of the run-end exchange, right after it
    signalled itself (so the runner's cancellation lands in that wait, every time).
    """
    import signal

    from asyncreplica_mpi import MPIProcessGroup
    from asyncreplica_mpi._protocol import Status

    agree, wait = MPIProcessGroup._agree, MPIProcessGroup._wait
    at_end: list[bool] = []

    async def agree_spy(self: Any, status: Status, *args: Any, **kwargs: Any) -> Any:
        fields = args[0] if args else None
        at_end[:] = [
            status is Status.FINISHED
            if where == "run_end"
            else isinstance(fields, dict) and fields.get("kind") == "reduce"
        ]
        return await agree(self, status, *args, **kwargs)

    async def wait_spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        if RANK == 0 and at_end == [True]:
            at_end.clear()
            os.kill(os.getpid(), signal.SIGINT)  # the runner cancels the main task
            WORLD.send("go", dest=1, tag=78)
        return await wait(self, *args, **kwargs)

    MPIProcessGroup._agree = agree_spy  # type: ignore[method-assign]
    MPIProcessGroup._wait = wait_spy  # type: ignore[method-assign]
    strategy = ar.MultiWorkerMirroredStrategy()

    first = [True]

    async def step() -> object:
        if RANK == 1 and first:
            first.clear()
            while not WORLD.Iprobe(source=0, tag=78):  # noqa: ASYNC110 -- MPI
                await asyncio.sleep(0.001)
            WORLD.recv(source=0, tag=78)
        return RANK

    try:
        if where == "reduce":
            first.clear()
            values = await strategy.run(step)
            if RANK == 1:
                while not WORLD.Iprobe(source=0, tag=78):  # noqa: ASYNC110 -- MPI
                    await asyncio.sleep(0.001)
                WORLD.recv(source=0, tag=78)
            report(f"reduce {await strategy.reduce('SUM', values, axis=None)}")
        await strategy.run(step)
        report("run returned")
        await strategy.run(step)
        report("second run returned")
    except BaseException as error:
        report(f"got {type(error).__name__}")
        raise


async def leak_dup(count: str) -> None:
    """A strategy per step on the program's own communicator: Dup, use, Free, drop."""
    import gc

    from asyncreplica_mpi import _arrival, _exit

    for _ in range(int(count)):
        comm = WORLD.Dup()
        strategy = ar.MultiWorkerMirroredStrategy(communicator=comm)
        await strategy.run(_sum_of_ids)
        comm.Free()
        del strategy
        gc.collect()
    report(f"held {len(_exit._groups)} groups, {len(_arrival._channels)} channels")


async def own_interrupt() -> None:
    """Process 0 exits after a run; process 1 gets Ctrl-C (asyncio.run) as its next starts."""
    import signal

    strategy = ar.MultiWorkerMirroredStrategy()
    await strategy.run(_sum_of_ids)
    if RANK == 0:
        report("exits")
        return
    os.kill(os.getpid(), signal.SIGINT)  # the runner cancels the main task
    try:
        await strategy.run(_sum_of_ids)
        report("not reached")
    except BaseException as error:
        report(f"got {type(error).__name__} ({type(error.__cause__).__name__})")
        raise


async def two_in_flight() -> None:
    """Two replicas a process; each issues two unnamed all_reduces at once (refused)."""
    strategy = ar.MultiWorkerMirroredStrategy(["CPU:0", "CPU:1"])

    async def one() -> object:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.all_reduce("SUM", np.ones(4))

    async def step() -> object:
        return await asyncio.gather(one(), one())

    try:
        await strategy.run(step)
        report("not refused")
    except ar.CollectiveError as error:
        report(f"{said(error)}")
    total = await strategy.reduce("SUM", await strategy.run(_one), axis=None)
    report(f"after {float(np.asarray(total).ravel()[0])}")


SCENARIOS: dict[str, Callable[..., Awaitable[None]]] = {
    f.__name__: f
    for f in (
        fp_settings,
        shared_op,
        freed_comm,
        end_interrupt,
        leak_dup,
        own_interrupt,
        two_in_flight,
    )
}

if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(float(os.environ.get("LIFECYCLE_GUARD_S", "60")), exit=True)
    asyncio.run(SCENARIOS[sys.argv[1]](*sys.argv[2:]))
    report("done")
