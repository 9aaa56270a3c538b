"""The 24d attack's cases (run under mpiexec, 2 processes, layout 2 + 1).

Usage: ``mpiexec -n 2 python attack24d.py <scenario> [args]``. Each scenario logs what
each process saw; the test reads the logs. A hang guard dumps the stacks and exits.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import numpy as np
from _report import RANK, report

import asyncreplica as ar

DEVICES = ["CPU:0", "CPU:1"][: 2 if RANK == 0 else 1]  # replicas 0, 1 | replica 2


def said(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0]}"


async def step(x: Any) -> Any:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return await ctx.all_reduce("SUM", x)


async def skew(how: str) -> None:
    """Process 1 alone refuses call 0 (the program catches it); then two good calls.

    Every value either process gets must be the right one for its call: a refusal that
    left the processes out of step paired each call with the peer's next one.
    """
    s = ar.MultiWorkerMirroredStrategy(DEVICES)
    v = s.experimental_distribute_values_from_function(
        lambda c: np.full(3, c.replica_id_in_sync_group + 1.0)
    )
    bad = RANK == 1
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "op": lambda: s.reduce("SUMM" if bad else "SUM", v, axis=None),
        "dest": lambda: s.extended.reduce_to("SUM", v, destinations=object() if bad else v),
        "brt": lambda: s.extended.batch_reduce_to("SUM", [(v, object() if bad else v)]),
        "opts": lambda: s.extended.reduce_to("SUM", v, v, options="x" if bad else None),  # type: ignore[arg-type]
        "run": lambda: s.run(step, args=(ar.PerReplica([1.0, 2.0]),)),
    }
    w = s.experimental_distribute_values_from_function(
        lambda c: np.full(3, 10.0**c.replica_id_in_sync_group)
    )
    steps: list[Callable[[], Awaitable[Any]]] = [calls[how]]
    steps += [lambda: s.reduce("SUM", w, axis=None)] * 2
    for i, call in enumerate(steps):
        try:
            result = await call()
            values = [np.asarray(r).ravel()[0] for r in s.experimental_local_results(result)]
            report(f"call {i}: {sorted({float(x) for x in values})}")
        except Exception as exc:
            report(f"call {i}: {said(exc)}")
            report("\n".join(f"  | {line}" for line in str(exc).splitlines()[1:]))


async def empty_max(one: str = "") -> None:
    """reduce(MAX, axis=0) of one row over 5 replicas: replicas 1-4 hold empty batches."""
    if one:
        s: ar.Strategy = ar.MirroredStrategy([f"CPU:{i}" for i in range(5)])
    else:
        s = ar.MultiWorkerMirroredStrategy([f"CPU:{i}" for i in range((2, 3)[RANK])])
    for x in s.experimental_distribute_dataset([np.ones((1, 2))]):
        v = await s.run(lambda x: x, args=(x,))
        try:
            await s.reduce("MAX", v, axis=0)
        except ValueError as exc:
            report(f"{type(exc).__name__}: {exc}")


async def late(x: Any) -> Any:
    ctx = ar.get_replica_context()
    assert ctx is not None
    if ctx.replica_id_in_sync_group == 2:
        await anyio.sleep(2)
    return await ctx.all_reduce("SUM", x)


async def timeout_fields(one: str = "") -> None:
    """Replica 2 (process 1) is 2 s late; every process times out after 0.5 s."""
    options = ar.CommunicationOptions(timeout_seconds=0.5)
    if one:
        s: ar.Strategy = ar.MirroredStrategy(
            ["CPU:0", "CPU:1", "CPU:2"], communication_options=options, stall_warning_seconds=None
        )
    else:
        s = ar.MultiWorkerMirroredStrategy(
            DEVICES, communication_options=options, stall_warning_seconds=None
        )
    try:
        await s.run(late, args=(1.0,))
    except ar.CollectiveTimeoutError as exc:
        report(f"missing={sorted(exc.missing)} arrived={sorted(exc.arrived)}")
        report(str(exc))
    except ar.CollectiveError as exc:
        report(said(exc))


SCENARIOS: dict[str, Callable[..., Awaitable[None]]] = {
    f.__name__: f for f in (skew, empty_max, timeout_fields)
}

if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(float(os.environ.get("LIFECYCLE_GUARD_S", "60")), exit=True)
    anyio.run(SCENARIOS[sys.argv[1]], *sys.argv[2:])
