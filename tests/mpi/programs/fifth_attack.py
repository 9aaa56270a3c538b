"""The fifth attack's cases (run under mpiexec, 2 processes).

Usage: ``mpiexec -n 2 python fifth_attack.py <scenario> [args]``. Each scenario logs
what each process saw; the test reads the logs. No scenario orders events by
sleeping; a hang guard dumps the stacks and exits.
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


def said(error: BaseException) -> str:
    try:
        text = str(error)
    except Exception:
        text = "<its __str__ raised>"
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


class BadStr(Exception):
    """A user's exception whose ``__str__`` raises (third-party libraries have such)."""

    def __str__(self) -> str:
        raise RuntimeError("str of this exception raises")


async def one_reduce() -> float:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return float((await ctx.all_reduce("SUM", np.ones(2)))[0])


async def surrogate_exit() -> None:
    """Process 1 dies of an exception whose message holds a lone surrogate (a file name
    from ``os.fsdecode`` that is not UTF-8) while process 0 waits in a collective."""
    # Its traceback escaped, so that the test reads the job's output as UTF-8 (where
    # stderr's handler is surrogateescape it would write the raw byte 0xff).
    sys.stderr.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    strategy = ar.MultiWorkerMirroredStrategy()
    if RANK == 1:
        name = os.fsdecode(b"/tmp/no-such-shard-\xff.npy")
        raise RuntimeError(f"cannot read shard {name}")
    try:
        await strategy.run(one_reduce)
        report("not reached")
    except ar.ReplicaExitedError as exc:
        report(f"got {type(exc).__name__}")
        # The message holds the name as the peer's exception did (a lone surrogate):
        # logged escaped, as UTF-8 cannot hold it.
        report(str(exc).encode("utf-8", "backslashreplace").decode())


async def _bad_step() -> float:
    ctx = ar.get_replica_context()
    assert ctx is not None
    await ctx.all_reduce("SUM", np.ones(2))
    if ctx.replica_id_in_sync_group == 1:
        raise BadStr()
    return float((await ctx.all_reduce("SUM", np.ones(2)))[0])


async def badstr_run() -> None:
    """Replica 1 (process 1's only one) raises an exception whose ``__str__`` raises;
    process 1 catches it and both run again."""
    strategy = ar.MultiWorkerMirroredStrategy()
    try:
        await strategy.run(_bad_step)
        report("not reached")
    except BaseException as exc:
        report(f"got {said(exc)}")
        if isinstance(exc, ar.ReplicaExitedError):
            report(str(exc))
    report(f"next {await strategy.run(one_reduce)}")


async def badstr_exit() -> None:
    """Process 1 dies of an uncaught exception whose ``__str__`` raises, outside run,
    while process 0 waits in a collective."""
    strategy = ar.MultiWorkerMirroredStrategy()
    if RANK == 1:
        raise BadStr()
    try:
        await strategy.run(one_reduce)
        report("not reached")
    except ar.ReplicaExitedError as exc:
        report(f"got {type(exc).__name__}")
        report(str(exc))


async def refused_args(how: str) -> None:
    """Process 1's constructor refuses its own arguments (``none``: ``devices=[]``;
    ``twice``: a device twice; ``type``: ``check_call_sites="yes"``, a TypeError); it
    catches the error. Both then create a strategy and run."""
    devices = ["CPU:0"]
    check: Any = True
    if RANK == 1:
        if how == "type":
            check = "yes"
        else:
            devices = [] if how == "none" else ["CPU:0", "CPU:0"]
    try:
        ar.MultiWorkerMirroredStrategy(devices, check_call_sites=check)
        report("not reached")
    except (TypeError, ValueError) as exc:
        report(f"got {type(exc).__name__}")
        report(str(exc))
    strategy = ar.MultiWorkerMirroredStrategy()
    report(f"next {await strategy.run(one_reduce)}")


async def creation_cycle() -> None:
    """Process 0 creates a strategy on COMM_WORLD, then one on a duplicate of it;
    process 1 in the opposite order. Each waits for the other for ever: the stall
    warning and the timeout (1 s, 2 s) must say the peer may be creating elsewhere."""
    import logging

    from mpi4py import MPI

    class Said(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            report(f"warning: {record.getMessage()}")

    logging.getLogger("asyncreplica").addHandler(Said())
    other = MPI.COMM_WORLD.Dup()
    options = ar.CommunicationOptions(timeout_seconds=2)
    order = [None, other] if RANK == 0 else [other, None]
    try:
        for comm in order:
            ar.MultiWorkerMirroredStrategy(
                communicator=comm, stall_warning_seconds=1, communication_options=options
            )
        report("not reached")
    except ar.CollectiveError as exc:  # the first to time out; the other is told
        report(f"got {type(exc).__name__}")
        report(str(exc))


SCENARIOS: dict[str, Callable[..., Awaitable[None]]] = {
    f.__name__: f
    for f in (
        surrogate_exit,
        badstr_run,
        badstr_exit,
        refused_args,
        creation_cycle,
    )
}

if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(float(os.environ.get("LIFECYCLE_GUARD_S", "60")), exit=True)
    anyio.run(SCENARIOS[sys.argv[1]], *sys.argv[2:])
