"""A process's life around MultiWorkerMirroredStrategy (run under mpiexec, 2 processes).

Usage: ``mpiexec -n 2 python lifecycle.py <scenario>``. Each scenario ends a process
in one way (exit, an uncaught exception, ``MPI.Finalize()``, a timeout, ...) and logs
what each process saw; the test reads the logs and the job's output. No scenario
orders events by sleeping: a process that must wait for another waits for a message
from it on ``COMM_WORLD`` (user tags), or for the library's own error.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import numpy as np
from _report import RANK, report
from mpi4py import MPI

import asyncreplica as ar

WORLD = MPI.COMM_WORLD
_GO_TAG = 77  # a user message between the test's processes


async def one_reduce() -> float:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return float((await ctx.all_reduce("SUM", np.ones(3)))[0])


def logged(error: BaseException) -> None:
    report(f"got {type(error).__name__}: {error}")


async def wait_for_go() -> None:
    """Wait (yielding) for the peer's go message."""
    while not WORLD.Iprobe(source=MPI.ANY_SOURCE, tag=_GO_TAG):  # noqa: ASYNC110 -- MPI
        await anyio.sleep(0.01)
    WORLD.recv(source=MPI.ANY_SOURCE, tag=_GO_TAG)


def go(rank: int) -> None:
    WORLD.send("go", dest=rank, tag=_GO_TAG)


async def exit_two(how: str) -> None:
    """Two strategies; process 0 exits (or raises) while process 1 uses the first one."""
    train = ar.MultiWorkerMirroredStrategy()
    evaluate = ar.MultiWorkerMirroredStrategy()
    await train.run(one_reduce)
    await evaluate.run(one_reduce)
    if RANK == 0:
        if how == "raise":
            raise ValueError("process 0 dies outside run")
        report("exits")
        return
    try:
        await train.run(one_reduce)
    except ar.ReplicaExitedError as exc:
        logged(exc)
    try:  # the failed group refuses at once (the FAILED state)
        await train.run(one_reduce)
    except ar.ReplicaExitedError as exc:
        report(f"again {type(exc).__name__}: {str(exc).splitlines()[0]}")


async def exit_normal(then: str) -> None:
    """Process 0 ends normally (no exception) while process 1 goes on.

    ``then``: what process 1 does once process 0 has left ``main``: ``create`` a second
    strategy (process 0 will create none), or a ``collective`` on the one they share.
    """
    first = ar.MultiWorkerMirroredStrategy()
    await first.run(one_reduce)
    if RANK == 0:
        report("exits")
        go(1)
        return
    await wait_for_go()
    try:
        if then == "create":
            second = ar.MultiWorkerMirroredStrategy()
            await second.run(one_reduce)
        else:
            await first.run(one_reduce)
        report("not reached")
    except ar.ReplicaExitedError as exc:
        logged(exc)
    if then == "create":
        try:  # the strategy both created: process 0's goodbye there releases it
            await first.run(one_reduce)
            report("not reached")
        except ar.ReplicaExitedError as exc:
            report(f"then {type(exc).__name__}: {exc}")


async def end_while_create() -> None:
    """3 processes: process 0 ends normally while processes 1 and 2 create a second."""
    first = ar.MultiWorkerMirroredStrategy()
    await first.run(one_reduce)
    if RANK == 0:
        report("exits")
        return
    try:
        ar.MultiWorkerMirroredStrategy()
        report("not reached")
    except ar.ReplicaExitedError as exc:
        logged(exc)
    try:
        await first.run(one_reduce)
        report("not reached")
    except ar.ReplicaExitedError as exc:
        report(f"then {type(exc).__name__}: {str(exc).splitlines()[0]}")


async def user_recv() -> None:
    """3 processes: process 0 ends normally; process 1 then sends process 2 an object,
    which process 2 receives with ``comm.recv()`` (any source, any tag)."""
    strategy = ar.MultiWorkerMirroredStrategy()
    await strategy.run(one_reduce)
    if RANK == 0:
        report("exits")
        return
    try:  # meets process 0's goodbye: its exit notes were sent before it
        await strategy.run(one_reduce)
        report("not reached")
    except ar.ReplicaExitedError as exc:
        logged(exc)
    if RANK == 1:
        WORLD.send({"hello": 1}, dest=2, tag=5)
        return
    status = MPI.Status()
    try:
        got = WORLD.recv(status=status)
        report(f"received {got!r} from {status.Get_source()} tag {status.Get_tag()}")
    except Exception as exc:
        report(
            f"recv raised {type(exc).__name__}: {exc} (from {status.Get_source()} tag "
            f"{status.Get_tag()})"
        )
        WORLD.recv(source=1, tag=5)  # process 1's object: no message is left behind


async def ctor_vs_run() -> None:
    """Process 0 creates a second strategy while process 1 makes a collective on the first.

    Process 0 times out first (3 s; process 1's timeout is 20 s): its exit then says
    goodbye on the first strategy, which releases process 1.
    """
    options = ar.CommunicationOptions(timeout_seconds=3 if RANK == 0 else 20)
    first = ar.MultiWorkerMirroredStrategy(communication_options=options, stall_warning_seconds=1)
    try:
        if RANK == 0:
            ar.MultiWorkerMirroredStrategy(communication_options=options, stall_warning_seconds=1)
        else:
            await first.run(one_reduce)
        report("not reached")
    except ar.CollectiveError as exc:
        report(f"got {type(exc).__name__}")


async def daemon_run() -> None:
    """Runs go on in a daemon thread; process 0's main thread ends after its first one."""
    import asyncio
    import threading

    strategy = ar.MultiWorkerMirroredStrategy()
    first = threading.Event()

    def worker() -> None:
        async def loop() -> None:
            while True:
                await strategy.run(one_reduce)
                first.set()

        try:
            asyncio.run(loop())
        except BaseException as exc:
            report(f"worker got {type(exc).__name__}: {exc}")

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    if RANK == 0:
        first.wait()
        report("exits")
        return
    thread.join()  # until the worker's run fails


async def goodbye_timeout() -> None:
    """Process 0 ends; process 1 stays busy: process 0's goodbye times out (2 s)."""
    options = ar.CommunicationOptions(timeout_seconds=2)
    strategy = ar.MultiWorkerMirroredStrategy(
        communication_options=options, stall_warning_seconds=1
    )
    await strategy.run(one_reduce)
    if RANK == 0:
        report("exits")
        return
    report("busy")
    WORLD.recv(source=0, tag=_GO_TAG)  # never sent: busy until the job is aborted
    report("not reached")


async def interrupt() -> None:
    """Process 1 interrupts process 0 (SIGINT) while process 0 waits for it in a collective.

    Process 0 tells process 1 just before its collective; process 1 sends the signal,
    waits until process 0 saw it (a task of process 0's that the interruption cancels
    says so), then makes the same collective.
    """
    import signal

    strategy = ar.MultiWorkerMirroredStrategy()
    pids = WORLD.allgather(os.getpid())

    async def step() -> float:
        if RANK == 0:
            go(1)  # about to wait for process 1 in the collective
        return await one_reduce()

    if RANK == 1:
        await wait_for_go()
        os.kill(pids[0], signal.SIGINT)
        await wait_for_go()  # process 0 was interrupted
        try:
            await strategy.run(step)
            report("returned")
        except ar.CollectiveError as exc:
            logged(exc)
        return

    async def watch() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            go(1)

    async def run() -> None:
        try:
            await strategy.run(step)
        finally:
            report("run ended")

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        tg.start_soon(run)


async def interrupt_goodbye(times: str) -> None:
    """Process 0 ends and is interrupted (SIGINT) while its goodbye waits for process 1.

    The goodbye's stall warning (0.2 s) is process 0's cue: it interrupts itself there
    (``times`` = ``once``) and then lets process 1 make its next run, which must raise
    naming process 0's exit; with ``twice`` a second SIGINT follows the message that
    says the first was seen (process 1 never comes back: the job is aborted).
    """
    import logging
    import signal

    strategy = ar.MultiWorkerMirroredStrategy(stall_warning_seconds=0.2)
    await strategy.run(one_reduce)
    if RANK == 1:
        if times == "once":
            await wait_for_go()
            try:
                await strategy.run(one_reduce)
                report("not reached")
            except ar.ReplicaExitedError as exc:
                logged(exc)
        else:
            report("busy")
            WORLD.recv(source=0, tag=_GO_TAG + 1)  # never sent: busy until the abort
            report("not reached")
        return

    class Cue(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("Exit stalled"):
                os.kill(os.getpid(), signal.SIGINT)
                if times == "once":
                    go(1)

    class Again:  # the message that says the first interruption was seen
        def __init__(self, stream: Any) -> None:
            self.stream = stream

        def write(self, text: str) -> int:
            if "Interrupt again to abort" in text and times == "twice":
                os.kill(os.getpid(), signal.SIGINT)
            return int(self.stream.write(text))

        def flush(self) -> None:
            self.stream.flush()

    logging.getLogger("asyncreplica").addHandler(Cue())
    sys.stderr = Again(sys.stderr)  # type: ignore[assignment]
    report("exits")


async def merge_in_run(path: str) -> None:
    """A trace block that ends inside a run is refused on every process, in step."""
    strategy = ar.MultiWorkerMirroredStrategy()

    async def traced_step() -> float:
        with strategy.trace(path):
            return await one_reduce()

    try:
        await strategy.run(traced_step)
    except ar.ReplicaContextError as exc:
        logged(exc)
    report(f"after {await strategy.run(one_reduce)}")


async def opposite() -> None:
    """Two strategies used in opposite orders: each process waits on a different one.

    Process 0 times out first (3 s; process 1's timeout is 20 s): its exit then says
    goodbye on the strategy process 1 waits on, which releases it.
    """
    options = ar.CommunicationOptions(timeout_seconds=3 if RANK == 0 else 20)
    a = ar.MultiWorkerMirroredStrategy(communication_options=options, stall_warning_seconds=1)
    b = ar.MultiWorkerMirroredStrategy(communication_options=options, stall_warning_seconds=1)
    first, second = (a, b) if RANK == 0 else (b, a)
    try:
        await first.run(one_reduce)
        await second.run(one_reduce)
    except ar.CollectiveError as exc:
        logged(exc)


async def nested_opposite(path: str) -> None:
    """Trace blocks of two strategies nested in opposite orders: a certain deadlock.

    Each inner block's end (a merge that blocks its process) waits on a different
    strategy than the peer's: no timeout is set, so only the cycle's error ends it.
    """
    a = ar.MultiWorkerMirroredStrategy()
    b = ar.MultiWorkerMirroredStrategy()
    first, second = (a, b) if RANK == 0 else (b, a)
    try:
        with first.trace(f"{path}.outer{RANK}.json"):
            with second.trace(f"{path}.inner{RANK}.json"):
                report(f"result {await a.run(one_reduce)} {await b.run(one_reduce)}")
            report("left the inner block")
    except ar.CollectiveDeadlockError as exc:
        logged(exc)
        report(f"cycle {exc.cycle}")
    try:
        await a.run(one_reduce)
    except ar.BackendError as exc:
        logged(exc)


async def busy_past_ack() -> None:
    """Process 0 times out while process 1 is busy longer than the acknowledgement wait.

    Process 0's exit waits 0.5 s (here) for process 1 to acknowledge its failure, then
    aborts the job (the processes are out of step), which stops process 1.
    """
    from asyncreplica_mpi import _exit  # after asyncreplica (it imports the backend)

    _exit._ACK_SECONDS = 0.5
    options = ar.CommunicationOptions(timeout_seconds=0.5)
    strategy = ar.MultiWorkerMirroredStrategy(communication_options=options)
    if RANK == 1:
        report("busy")
        time.sleep(30)  # noqa: ASYNC251 -- user code that never yields (ended by the abort)
        report("not reached")
        return
    try:
        await strategy.run(one_reduce)
    except ar.CollectiveTimeoutError as exc:
        logged(exc)


async def finalize_run() -> None:
    """Process 0 finalizes MPI; process 1 then makes another run."""
    strategy = ar.MultiWorkerMirroredStrategy()
    await strategy.run(one_reduce)
    if RANK == 0:
        MPI.Finalize()
        report("finalized")
        try:
            await strategy.run(one_reduce)
        except ar.BackendError as exc:
            logged(exc)
        return
    try:
        await strategy.run(one_reduce)
    except ar.ReplicaExitedError as exc:
        logged(exc)


async def finalize_only() -> None:
    """A correct program in which only process 0 finalizes MPI (at its end)."""
    a = ar.MultiWorkerMirroredStrategy()
    b = ar.MultiWorkerMirroredStrategy()
    report(f"result {await a.run(one_reduce)} {await b.run(one_reduce)}")
    if RANK == 0:
        MPI.Finalize()
    report("done")


async def finalize_mid() -> None:
    """Process 1 finalizes MPI inside a run, then keeps using asyncreplica.

    Every later use on process 1 raises BackendError (MPICH would abort the process on
    any MPI call); process 0 sees process 1 leave.
    """
    strategy = ar.MultiWorkerMirroredStrategy()

    async def step() -> float:
        ctx = ar.get_replica_context()
        assert ctx is not None
        first = await ctx.all_reduce("SUM", np.ones(3))
        if RANK == 1:
            MPI.Finalize()
        return float((await ctx.all_reduce("SUM", first))[0])

    uses: dict[str, Callable[[], Awaitable[Any]]] = {
        "run": lambda: strategy.run(step),
        "reduce": lambda: strategy.reduce("SUM", np.float64(1.0), axis=None),
        "gather": lambda: strategy.gather(np.ones(2), axis=0),
        "reduce_to": lambda: strategy.extended.reduce_to("SUM", np.float64(1.0), "CPU:0"),
        "next run": lambda: strategy.run(one_reduce),
    }
    for name, use in uses.items():
        try:
            await use()
            report(f"{name}: returned")
        except Exception as exc:
            report(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    if RANK == 1:
        try:
            ar.MultiWorkerMirroredStrategy()
        except Exception as exc:
            report(f"create: {type(exc).__name__}: {str(exc).splitlines()[0]}")


async def finalize_first() -> None:
    """Process 1 finalizes MPI before creating any strategy; process 0 creates one."""
    if RANK == 1:
        MPI.Finalize()
        report("finalized")
        return
    try:
        ar.MultiWorkerMirroredStrategy()
    except ar.ReplicaExitedError as exc:
        logged(exc)


async def reduce_to_timeout() -> None:
    """``options=`` of extended.reduce_to / batch_reduce_to bounds the wait (1 s, not 20)."""
    import time

    options = ar.CommunicationOptions(timeout_seconds=20)
    a = ar.MultiWorkerMirroredStrategy(communication_options=options)
    b = ar.MultiWorkerMirroredStrategy(communication_options=options)
    c = ar.MultiWorkerMirroredStrategy(communication_options=options)
    one = ar.CommunicationOptions(timeout_seconds=1)
    if RANK == 1:
        await wait_for_go()  # late until process 0 has timed out on both
    for name, call in (
        ("reduce_to", lambda: a.extended.reduce_to("MEAN", np.float64(1), "CPU:0", options=one)),
        (
            "batch_reduce_to",
            lambda: b.extended.batch_reduce_to("MEAN", [(np.float64(1), "CPU:0")], options=one),
        ),
        # (a bool MAX the local backend refuses: refused in the agreement, which the
        # option bounds too)
        ("refused", lambda: c.extended.reduce_to("MAX", np.ones(2, bool), "CPU:0", options=one)),
    ):
        start = time.perf_counter()
        try:
            await call()
            report(f"{name}: returned")
        except ar.CollectiveError as exc:
            report(f"{name}: {type(exc).__name__} after {time.perf_counter() - start:.1f}")
    if RANK == 0:
        go(1)


async def trace_raise(path: str) -> None:
    """Process 0 raises inside ``with strategy.trace`` but outside run; 1 is in a run."""
    strategy = ar.MultiWorkerMirroredStrategy()
    try:
        with strategy.trace(path):
            if RANK == 0:
                raise ValueError("process 0 fails inside its trace block")
            await strategy.run(one_reduce)
    except ar.ReplicaExitedError as exc:
        logged(exc)
        raise


async def trace_peer_raise(path: str) -> None:
    """Process 1 raises inside ``with strategy.trace`` after its run; process 0 does not."""
    strategy = ar.MultiWorkerMirroredStrategy()
    try:
        with strategy.trace(path):
            await strategy.run(one_reduce)
            if RANK == 1:
                raise ValueError("process 1 fails inside its trace block")
    except Exception as exc:
        logged(exc)


async def crash_before() -> None:
    """Process 0 dies of an uncaught exception before it creates its strategy."""
    if RANK == 0:
        raise ValueError("process 0 dies before its strategy")
    try:
        ar.MultiWorkerMirroredStrategy()
    except ar.ReplicaExitedError as exc:
        logged(exc)


async def crash_inside() -> None:
    """Process 0 dies inside the constructor (bad arguments); process 1 creates it.

    Process 0's constructor tells its refusal (process 1 raises the same class), then
    process 0 dies of it.
    """
    try:
        ar.MultiWorkerMirroredStrategy(["CPU:0"] if RANK else ["not a device"])
    except (ar.ReplicaExitedError, ValueError) as exc:
        if RANK == 0:
            raise
        logged(exc)


async def late() -> None:
    """Process 0 gives up creating (timeout) just after process 1 arrived.

    Process 0's give-up note is sent only once process 1 has received every arrival
    note and is about to create the group: a process that looked for the note once,
    then, never saw it and entered ``MPI_Comm_dup`` alone.
    """
    from asyncreplica_mpi import _arrival

    if RANK == 0:
        give_up = _arrival._give_up

        def late_give_up(*args: Any) -> None:
            go(1)  # process 1 may come now
            WORLD.recv(source=1, tag=_GO_TAG)  # it has every arrival note
            give_up(*args)

        _arrival._give_up = late_give_up  # type: ignore[assignment]
        options = ar.CommunicationOptions(timeout_seconds=0.5)
        try:
            ar.MultiWorkerMirroredStrategy(communication_options=options)
        except ar.CollectiveTimeoutError as exc:
            logged(exc)
        return
    await wait_for_go()
    told: list[bool] = []

    class Arrived(MPI.Intracomm):  # type: ignore[misc]
        """COMM_WORLD, telling process 0 when it first looks for the give-up note."""

        def _look(self, tag: int) -> None:
            if tag == _arrival._GAVE_UP_TAG and not told:
                told.append(True)  # every arrival note is in
                go(0)

        def Iprobe(self, *args: Any, **kwargs: Any) -> Any:
            self._look(kwargs.get("tag", -1))
            return super().Iprobe(*args, **kwargs)

        def Irecv(self, *args: Any, **kwargs: Any) -> Any:
            self._look(kwargs.get("tag", -1))
            return super().Irecv(*args, **kwargs)

    try:
        ar.MultiWorkerMirroredStrategy(communicator=Arrived(WORLD))
    except ar.BackendError as exc:
        logged(exc)


async def data_stall() -> None:
    """Process 1 agrees on a large all_reduce, then does not send its data."""
    options = ar.CommunicationOptions(timeout_seconds=2)
    strategy = ar.MultiWorkerMirroredStrategy(
        communication_options=options, stall_warning_seconds=1
    )
    if RANK == 1:
        from asyncreplica_mpi._backend import MPIBackend

        move = MPIBackend._move

        stalled: list[bool] = []

        async def stopped(self: MPIBackend, *args: Any, **kwargs: Any) -> None:
            if not stalled:  # the data's move only (a float SUM moves its flags next)
                stalled.append(True)
                await wait_for_go()  # "stopped" until process 0 has given up
            await move(self, *args, **kwargs)

        MPIBackend._move = stopped  # type: ignore[method-assign]

    async def big() -> float:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return float((await ctx.all_reduce("SUM", np.ones(100_000)))[0])

    try:
        await strategy.run(big)
    except ar.CollectiveError as exc:
        logged(exc)
    if RANK == 0:
        go(1)


async def call_timeout() -> None:
    """A collective's own timeout_seconds (1 s) bounds a wait for a late process."""
    import time

    strategy = ar.MultiWorkerMirroredStrategy(
        communication_options=ar.CommunicationOptions(timeout_seconds=20)
    )

    async def late_peer() -> float:
        ctx = ar.get_replica_context()
        assert ctx is not None
        if RANK == 1:
            await wait_for_go()  # late until process 0 has timed out
        options = ar.CommunicationOptions(timeout_seconds=1)
        return float((await ctx.all_reduce("SUM", np.ones(3), options=options))[0])

    start = time.perf_counter()
    try:
        await strategy.run(late_peer)
    except ar.CollectiveError as exc:
        logged(exc)
    if RANK == 0:
        report(f"waited {time.perf_counter() - start:.1f}")
        go(1)


async def inline_miss(kind: str) -> None:
    """An integer MEAN just past the inline size; process 1 fails moving its data."""
    strategy = ar.MultiWorkerMirroredStrategy()
    if RANK == 1:
        from asyncreplica_mpi._backend import MPIBackend

        async def broken(self: MPIBackend, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("injected failure in the data transfer")

        MPIBackend._combine_leaves = broken  # type: ignore[method-assign]
    size = 192 if kind == "int" else 300  # int64: 1.5 KiB, halves 3 KiB; 2.3 KiB floats

    async def mean() -> float:
        ctx = ar.get_replica_context()
        assert ctx is not None
        value = np.arange(size, dtype=np.int64 if kind == "int" else np.float64)
        return float((await ctx.all_reduce("MEAN", value))[1])

    try:
        await strategy.run(mean)
    except (ar.CollectiveError, RuntimeError) as exc:
        logged(exc)


async def refused() -> None:
    """Process 1 runs two steps at once (the second is refused); process 0 in turn."""
    strategy = ar.MultiWorkerMirroredStrategy()
    if RANK == 0:
        await strategy.run(one_reduce)
        try:
            await strategy.run(one_reduce)
        except ar.ReplicaExitedError as exc:
            logged(exc)
    else:
        results: list[Any] = []

        async def keep(fn: Callable[[], Awaitable[Any]]) -> None:
            try:
                results.append(await fn())
            except ar.ReplicaContextError as exc:
                logged(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(keep, lambda: strategy.run(one_reduce))
            tg.start_soon(keep, lambda: strategy.run(one_reduce))
    # The strategy stays usable, in step, on both processes.
    report(f"after {await strategy.run(one_reduce)}")


async def leak(count: str) -> None:
    """A strategy per step, dropped after it: the communicators must not run out."""
    for _ in range(int(count)):
        strategy = ar.MultiWorkerMirroredStrategy()
        await strategy.run(one_reduce)
        del strategy
        gc.collect(0)
    from asyncreplica_mpi import _exit

    report(f"held {len(_exit._groups)} groups")
    report("done")


async def os_exit() -> None:
    """Process 0 leaves with ``os._exit(0)`` while process 1 waits in a collective."""
    strategy = ar.MultiWorkerMirroredStrategy()
    await strategy.run(one_reduce)
    if RANK == 0:
        report("os._exit")
        os._exit(0)
    report("waits")
    await strategy.run(one_reduce)
    report("not reached")


SCENARIOS: dict[str, Callable[..., Awaitable[None]]] = {
    f.__name__: f
    for f in (
        exit_two,
        exit_normal,
        end_while_create,
        user_recv,
        ctor_vs_run,
        daemon_run,
        goodbye_timeout,
        interrupt,
        interrupt_goodbye,
        merge_in_run,
        opposite,
        nested_opposite,
        busy_past_ack,
        finalize_run,
        finalize_only,
        finalize_mid,
        finalize_first,
        reduce_to_timeout,
        trace_raise,
        trace_peer_raise,
        crash_before,
        crash_inside,
        late,
        data_stall,
        call_timeout,
        inline_miss,
        refused,
        leak,
        os_exit,
    )
}

if __name__ == "__main__":
    import faulthandler

    # The test's hang guard: a process still alive then prints where it waits, and exits.
    faulthandler.dump_traceback_later(float(os.environ.get("LIFECYCLE_GUARD_S", "60")), exit=True)
    anyio.run(SCENARIOS[sys.argv[1]], *sys.argv[2:])
