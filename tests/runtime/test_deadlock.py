"""Wait cycles of named collectives are found through every way a replica joins its tasks.

A replica that waits for its own helper tasks (a task group, ``asyncio.gather``, ``await
task``, ``asyncio.wait``, ``asyncio.wait_for`` without a timeout, ``asyncio.shield``) cannot
break a cycle by itself: the run must see through the join to the helpers, and report the
cycle at once instead of hanging. A join that cannot be analysed (a plain future, an event,
a join with a timer) is never reported as a cycle; the timeout and the stall warning end it.

The check is incremental: an arrival inspects a bounded number of tasks, however many
replicas the run has (counted, not timed).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from _clocks import trio_on_autojump_clock

import asyncreplica as ar
from asyncreplica._runtime import _run

pytestmark = pytest.mark.anyio

HANG_GUARD = 10.0


def strategy(n: int, **kwargs: Any) -> ar.MirroredStrategy:
    return ar.MirroredStrategy([f"CPU:{i}" for i in range(n)], **kwargs)


def context() -> ar.ReplicaContext:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return ctx


async def _taskgroup(make: Callable[[], Awaitable[Any]]) -> None:
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: make())


async def _gather(make: Callable[[], Awaitable[Any]]) -> None:
    await asyncio.gather(make())


async def _nested_gather(make: Callable[[], Awaitable[Any]]) -> None:
    await asyncio.gather(asyncio.gather(make()), asyncio.sleep(0))


async def _await_task(make: Callable[[], Awaitable[Any]]) -> None:
    task = asyncio.ensure_future(make())
    await task


async def _wait(make: Callable[[], Awaitable[Any]]) -> None:
    await asyncio.wait([asyncio.ensure_future(make())])


async def _wait_first_completed(make: Callable[[], Awaitable[Any]]) -> None:
    await asyncio.wait([asyncio.ensure_future(make())], return_when=asyncio.FIRST_COMPLETED)


async def _wait_for(make: Callable[[], Awaitable[Any]]) -> None:
    await asyncio.wait_for(make(), None)


async def _shield(make: Callable[[], Awaitable[Any]]) -> None:
    await asyncio.shield(make())


async def _asyncio_taskgroup(make: Callable[[], Awaitable[Any]]) -> None:
    async with asyncio.TaskGroup() as tg:
        tg.create_task(make())  # type: ignore[arg-type]


JOINS = {
    "taskgroup": _taskgroup,
    "asyncio-taskgroup": _asyncio_taskgroup,
    "gather": _gather,
    "nested-gather": _nested_gather,
    "await-task": _await_task,
    "wait": _wait,
    "wait-first-completed": _wait_first_completed,
    "wait_for": _wait_for,
    "shield": _shield,
}


def _asyncio_only(join: str, backend: object) -> None:
    if join != "taskgroup" and backend == "trio":
        pytest.skip("an asyncio join form")


@pytest.mark.parametrize("join", list(JOINS))
async def test_a_cycle_through_a_join_is_reported_at_once(join: str, anyio_backend: object) -> None:
    _asyncio_only(join, anyio_backend)
    s = strategy(2)  # no timeout: the cycle is certain

    async def step() -> None:
        ctx = context()
        first, second = ("x", "y") if ctx.replica_id_in_sync_group == 0 else ("y", "x")
        await JOINS[join](lambda: ctx.all_reduce("sum", 1.0, name=first))
        await ctx.all_reduce("sum", 1.0, name=second)

    with anyio.fail_after(HANG_GUARD), pytest.raises(ar.CollectiveDeadlockError) as info:
        await s.run(step)
    assert info.value.cycle == ((0, "x"), (1, "y"))


@pytest.mark.parametrize("join", list(JOINS))
async def test_the_same_joins_without_a_cycle_complete(join: str, anyio_backend: object) -> None:
    _asyncio_only(join, anyio_backend)
    s = strategy(3)

    async def step() -> float:
        ctx = context()
        rid = ctx.replica_id_in_sync_group
        await JOINS[join](lambda: ctx.all_reduce("sum", float(rid), name="x"))
        return await ctx.all_reduce("sum", 1.0, name="y")  # type: ignore[no-any-return]

    with anyio.fail_after(HANG_GUARD):
        result = await s.run(step)
    assert s.experimental_local_results(result) == (3.0, 3.0, 3.0)


async def test_a_helper_waiting_on_a_failed_sibling_is_not_a_cycle(anyio_backend: object) -> None:
    """A joined task that raised wakes its joiner: that is the replica's error, not a cycle."""
    _asyncio_only("gather", anyio_backend)
    s = strategy(2)

    async def boom() -> None:
        await asyncio.sleep(0)
        raise ValueError("boom")

    async def step() -> None:
        ctx = context()
        if ctx.replica_id_in_sync_group == 0:
            await asyncio.gather(boom(), ctx.all_reduce("sum", 1.0, name="x"))
        else:
            await ctx.all_reduce("sum", 1.0, name="y")

    with anyio.fail_after(HANG_GUARD), pytest.raises(ValueError, match="boom"):
        await s.run(step)


@trio_on_autojump_clock
async def test_a_join_on_a_plain_event_is_not_analysed_and_times_out(
    anyio_backend: object,
) -> None:
    """A replica waiting on an event its helper sets may be woken by anything: the timeout ends it.

    docs/hangs.md: a cycle hidden behind an event, a queue or a future that the run cannot
    follow is reported by the stall warning and, with ``timeout_seconds``, by
    ``CollectiveTimeoutError``; never by a hang.
    """
    s = strategy(2, communication_options=ar.CommunicationOptions(timeout_seconds=0.3))

    async def step() -> None:
        ctx = context()
        first, second = ("x", "y") if ctx.replica_id_in_sync_group == 0 else ("y", "x")
        done = anyio.Event()

        async def helper() -> None:
            await ctx.all_reduce("sum", 1.0, name=first)
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(helper)
            await done.wait()  # a plain event: not a join the run can see through
            await ctx.all_reduce("sum", 1.0, name=second)

    with anyio.fail_after(HANG_GUARD), pytest.raises(ar.CollectiveTimeoutError):
        await s.run(step)


async def test_a_join_with_a_timer_is_not_a_cycle_and_the_stall_warning_names_it(
    caplog: pytest.LogCaptureFixture, anyio_backend: object
) -> None:
    """``asyncio.wait(..., timeout=...)`` can wake on its own: no cycle, the stall warning says so."""
    _asyncio_only("wait", anyio_backend)
    s = strategy(
        2,
        communication_options=ar.CommunicationOptions(timeout_seconds=0.6),
        stall_warning_seconds=0.1,
    )

    async def step() -> None:
        ctx = context()
        first, second = ("x", "y") if ctx.replica_id_in_sync_group == 0 else ("y", "x")
        task = asyncio.ensure_future(ctx.all_reduce("sum", 1.0, name=first))
        await asyncio.wait([task], timeout=HANG_GUARD)
        await ctx.all_reduce("sum", 1.0, name=second)

    with (
        caplog.at_level(logging.WARNING, logger="asyncreplica"),
        anyio.fail_after(HANG_GUARD),
        pytest.raises(ar.CollectiveTimeoutError),
    ):
        await s.run(step)
    assert any(r.getMessage().startswith("Collective stalled") for r in caplog.records)


# -- the check is incremental ------------------------------------------------------------------


async def _inspections_per_arrival(n: int) -> float:
    """Run 5 all_reduces per replica with another one in flight; count inspections.

    Replica 0 issues "grads" last, so from its first arrival on, every replica is waiting
    and every arrival checks for a cycle.
    """
    s = strategy(n, stall_warning_seconds=None)
    counts: list[int] = []

    async def steps(ctx: ar.ReplicaContext) -> None:
        for k in range(5):
            await ctx.all_reduce("sum", 1.0, name=f"step{k}")

    async def step() -> None:
        ctx = context()
        if ctx.replica_id_in_sync_group == 0:  # keeps "grads" in flight meanwhile
            await steps(ctx)
            await ctx.all_reduce("sum", 1.0, name="grads")
            return
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: ctx.all_reduce("sum", 1.0, name="grads"))
            await steps(ctx)

    original = _run.Run._check_deadlock

    def counting(self: _run.Run, replica: int, *, current: object = None) -> None:
        try:
            original(self, replica, current=current)
        finally:
            counts.append(self.inspections)

    _run.Run._check_deadlock = counting  # type: ignore[method-assign]
    try:
        with anyio.fail_after(HANG_GUARD * 3):
            await s.run(step)
    finally:
        _run.Run._check_deadlock = original  # type: ignore[method-assign]
    assert len(counts) > n, "the collective in flight makes arrivals check for a cycle"
    return counts[-1] / (5 * n)


async def test_an_arrivals_deadlock_check_does_not_grow_with_the_replicas() -> None:
    small = await _inspections_per_arrival(16)
    large = await _inspections_per_arrival(256)
    # A full rescan per arrival inspects about n/2 replicas' tasks: 8 and 128 here. The
    # incremental check stays near 1-2.5 at any size; trio shuffles its run queue on
    # purpose, which moves the count by up to about 1.2 between sizes (25 runs each).
    assert large <= 4.0, (small, large)
    assert large <= small + 2.0, (small, large)


@pytest.mark.parametrize(
    "limits",
    [
        pytest.param({"stall_warning_seconds": 0.05}, id="stall-warning"),
        pytest.param(
            {
                "stall_warning_seconds": None,
                "communication_options": ar.CommunicationOptions(timeout_seconds=0.1),
            },
            id="timeout",
        ),
    ],
)
@trio_on_autojump_clock
async def test_a_join_begun_after_the_helpers_parked_is_still_reported_as_a_cycle(
    limits: dict[str, Any], anyio_backend: object
) -> None:
    """No event marks a replica starting to join helpers that already wait: the stall watcher
    and an expired timeout look again, and report the cycle rather than a stall."""
    s = strategy(2, **limits)

    async def step() -> None:
        ctx = context()
        first, second = ("x", "y") if ctx.replica_id_in_sync_group == 0 else ("y", "x")
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: ctx.all_reduce("sum", 1.0, name=first))
            for _ in range(2):  # the helper runs (and parks) before the join begins
                await anyio.lowlevel.checkpoint()
        await ctx.all_reduce("sum", 1.0, name=second)

    with anyio.fail_after(HANG_GUARD), pytest.raises(ar.CollectiveDeadlockError) as info:
        await s.run(step)
    assert info.value.cycle == ((0, "x"), (1, "y"))
