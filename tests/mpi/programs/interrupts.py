"""Ctrl-C (SIGINT) on process 0 at points of a run and of creation (mpiexec, 2 processes).

Usage: ``mpiexec -n 2 python interrupts.py <scenario>``. Process 0 is interrupted; each
scenario logs what each process saw, and the test reads the logs and the job's output.
Process 1 waits (blocked, without yielding) for a message that process 0 sends from
its exit hook, so it meets process 0's interruption only once process 0 has taken it:
nothing is ordered by sleeping. A helper thread of process 0 sends the signal once
process 0 waits where the scenario says (it polls the library's state for that).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

import anyio
import numpy as np
from _report import RANK, report
from asyncreplica_mpi import _arrival, _exit
from mpi4py import MPI

import asyncreplica as ar

WORLD = MPI.COMM_WORLD
_GO_TAG = 78  # a user message between the test's processes


async def one_reduce() -> float:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return float((await ctx.all_reduce("SUM", np.ones(3)))[0])


def go_at_exit() -> None:
    """Process 0: release process 1 from this process's exit (before the goodbye)."""
    atexit.register(lambda: WORLD.send("go", dest=1, tag=_GO_TAG))


def when(condition: Callable[[], bool], then: Callable[[], None]) -> None:
    """Process 0: a thread that calls ``then`` once ``condition`` holds."""

    def watch() -> None:
        while not condition():
            time.sleep(0.001)
        then()

    threading.Thread(target=watch, daemon=True).start()


def interrupt() -> None:
    report("SIGINT")
    os.kill(os.getpid(), signal.SIGINT)


def waits_in_exchange() -> bool:
    """Process 0 has posted an exchange that process 1 cannot complete yet."""
    return bool(_exit._groups) and _exit._groups[0]._in_flight


async def runs(strategy: ar.MultiWorkerMirroredStrategy, *, late: bool = True) -> None:
    """Run until process 0's interruption is told (``late``: process 1 from its exit)."""
    if RANK == 1 and late:
        WORLD.recv(source=0, tag=_GO_TAG)  # blocked: busy outside collectives
    for count in range(1000):
        try:
            await strategy.run(one_reduce)
        except ar.CollectiveError as exc:
            report(f"got {type(exc).__name__} after {count} runs: {exc}")
            return
        except BaseException as exc:
            report(f"raised {type(exc).__name__} after {count} runs")
            raise
    report("never interrupted")


async def start_then_interrupt() -> None:
    """KeyboardInterrupt lands just after the persistent exchange's Start() on process 0."""
    strategy = ar.MultiWorkerMirroredStrategy()
    if RANK == 0:
        group = _exit._groups[0]
        gather = group._gather
        starts = [0]

        class Interrupted(type(gather)):  # type: ignore[misc]
            def Start(self) -> None:
                super().Start()
                starts[0] += 1
                if starts[0] == 3:  # the 2nd run's collective
                    report("KeyboardInterrupt after Start")
                    raise KeyboardInterrupt

        group._gather = Interrupted(gather)
    await runs(strategy, late=False)


async def in_wait() -> None:
    """SIGINT while process 0 waits at an exchange, outside asyncio's runner."""
    strategy = ar.MultiWorkerMirroredStrategy()
    if RANK == 0:
        go_at_exit()
        when(waits_in_exchange, interrupt)
    await runs(strategy)


async def twice() -> None:
    """SIGINT under asyncio.run while process 0 waits; once it says so, a second SIGINT."""
    strategy = ar.MultiWorkerMirroredStrategy()
    if RANK == 0:
        said = threading.Event()

        class Pending(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if "was interrupted (SIGINT, Ctrl-C) while it waits" in record.getMessage():
                    report(f"said: {record.getMessage()}")
                    said.set()

        logging.getLogger("asyncreplica").addHandler(Pending())
        go_at_exit()

        def first_then_second() -> None:
            interrupt()
            if not said.wait(10):
                report("the pending interruption was not said")
            interrupt()

        when(waits_in_exchange, first_then_second)
    await runs(strategy)


async def in_constructor() -> None:
    """SIGINT under asyncio.run while process 0 waits in the constructor for process 1."""
    if RANK == 1:
        WORLD.recv(source=0, tag=_GO_TAG)  # process 1 creates its strategy late
    else:
        go_at_exit()
        when(lambda: bool(_arrival._created), interrupt)
    try:
        strategy = ar.MultiWorkerMirroredStrategy()
    except ar.CollectiveError as exc:
        report(f"got {type(exc).__name__}: {exc}")
        return
    except BaseException as exc:
        report(f"raised {type(exc).__name__} in the constructor")
        raise
    report("created")
    await runs(strategy)


async def in_trace_merge() -> None:
    """SIGINT (or SIGTERM, whose handler raises SystemExit: ``sys.argv[2]``) while
    process 0 waits at the end of ``strategy.trace(...)``, outside asyncio's runner;
    process 1 is still busy inside its block."""
    strategy = ar.MultiWorkerMirroredStrategy()
    term = sys.argv[2:] == ["TERM"]
    if term:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if RANK == 0:
        go_at_exit()

        def kill() -> None:
            report("SIGTERM" if term else "SIGINT")
            os.kill(os.getpid(), signal.SIGTERM if term else signal.SIGINT)

        def waits_in_merge() -> bool:
            group = _exit._groups[0] if _exit._groups else None
            pending = None if group is None else group._pending
            return bool(
                group is not None
                and group._in_flight
                and pending is not None
                and pending[1].get("describe") == "the end of strategy.trace(...)"
            )

        when(waits_in_merge, kill)
    try:
        with strategy.trace(os.path.join(os.environ["ASYNCREPLICA_TEST_OUT"], "trace.json")):
            await strategy.run(one_reduce)
            if RANK == 1:
                WORLD.recv(source=0, tag=_GO_TAG)  # blocked: busy inside its block
    except ar.CollectiveError as exc:
        report(f"got {type(exc).__name__}: {exc}")
        return
    except BaseException as exc:
        report(f"raised {type(exc).__name__} at the end of the trace block")
        raise
    report("merged")


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(float(os.environ.get("LIFECYCLE_GUARD_S", "60")), exit=True)
    scenario = {
        f.__name__: f
        for f in (start_then_interrupt, in_wait, twice, in_constructor, in_trace_merge)
    }[sys.argv[1]]
    if sys.argv[1] in ("in_wait", "in_trace_merge"):
        # No asyncio.Runner: SIGINT raises KeyboardInterrupt wherever the loop is: in the
        # run (reported by `runs`) or in the loop's select, out of run_until_complete.
        try:
            asyncio.new_event_loop().run_until_complete(scenario())
        except KeyboardInterrupt:
            report("raised KeyboardInterrupt in the event loop, outside the run")
            raise
    else:
        anyio.run(scenario)
