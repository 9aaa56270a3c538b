"""Nothing of a run is left waiting: merge_fns are watched, helper tasks are resolved.

* A ``merge_fn`` that does not return gets the stall warning and ``timeout_seconds``, like a
  replica that does not arrive.
* A collective awaited by a task the replica did not await (``asyncio.ensure_future``)
  resolves with a clear error when the run fails or is cancelled; other unfinished helper
  tasks of a failed run are cancelled; nothing is destroyed pending.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import anyio
import pytest
from _clocks import on_autojump_clock, trio_on_autojump_clock

import asyncreplica as ar

pytestmark = pytest.mark.anyio

HANG_GUARD = 10.0
_FILE = "runtime/test_leftovers.py"


def strategy(n: int, **kwargs: Any) -> ar.MirroredStrategy:
    return ar.MirroredStrategy([f"CPU:{i}" for i in range(n)], **kwargs)


def context() -> ar.ReplicaContext:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return ctx


# -- a merge_fn that never returns ---------------------------------------------------------------


async def stuck_merge(strategy: ar.Strategy, event: anyio.Event) -> int:
    await event.wait()  # @stuck
    return 1


def _line(marker: str) -> int:
    with open(__file__, encoding="utf-8") as source:
        hits = [n for n, text in enumerate(source, 1) if text.rstrip().endswith(f"# @{marker}")]
    assert len(hits) == 1
    return hits[0]


@trio_on_autojump_clock
@pytest.mark.parametrize("n", [1, 3])
async def test_a_merge_fn_that_never_returns_times_out(n: int) -> None:
    s = strategy(n, communication_options=ar.CommunicationOptions(timeout_seconds=0.2))
    never = anyio.Event()

    async def step() -> object:
        return await context().merge_call(stuck_merge, args=(never,))

    with anyio.fail_after(HANG_GUARD), pytest.raises(ar.CollectiveTimeoutError) as info:
        await s.run(step)
    message = str(info.value)
    first = message.splitlines()[0]
    assert first.startswith("Timed out after 0.2 s waiting for merge_fn stuck_merge to return")
    assert f"awaiting at {_FILE}:{_line('stuck')} in stuck_merge()" in message
    assert info.value.missing == frozenset()
    assert info.value.arrived == frozenset(range(n))


@on_autojump_clock
async def test_a_merge_fn_timeout_counts_from_when_the_merge_fn_starts() -> None:
    # docs/hangs.md: "timeout_seconds (counted from when merge_fn starts)". The late
    # arrival (0.6 s) and the merge_fn (0.6 s) each stay under the 1 s timeout; together
    # they exceed it, and no timeout fires. The sleeps are work, not ordering.
    s = strategy(2, communication_options=ar.CommunicationOptions(timeout_seconds=1.0))

    async def slow_merge(strategy: ar.Strategy) -> int:
        await anyio.sleep(0.6)
        return 5

    async def step() -> object:
        if context().replica_id_in_sync_group == 1:
            await anyio.sleep(0.6)
        return await context().merge_call(slow_merge)

    with anyio.fail_after(HANG_GUARD):
        started = anyio.current_time()
        assert await s.run(step) == 5
        assert anyio.current_time() - started >= 1.2


@trio_on_autojump_clock
async def test_a_merge_fn_that_stalls_is_warned_about_then_resumes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = strategy(3, stall_warning_seconds=0.05)
    release = anyio.Event()

    class SetOnStall(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("Collective stalled"):
                release.set()  # the merge_fn "recovers" once the warning is out

    handler = SetOnStall()
    logger = logging.getLogger("asyncreplica")
    logger.addHandler(handler)

    async def step() -> object:
        return await context().merge_call(stuck_merge, args=(release,))

    try:
        with caplog.at_level(logging.WARNING, logger="asyncreplica"), anyio.fail_after(HANG_GUARD):
            result = await s.run(step)
    finally:
        logger.removeHandler(handler)
    assert result == 1
    messages = [r.getMessage() for r in caplog.records]
    stalled = [m for m in messages if m.startswith("Collective stalled")]
    assert len(stalled) == 1
    assert "for merge_fn stuck_merge to return" in stalled[0]
    assert f"awaiting at {_FILE}:{_line('stuck')} in stuck_merge()" in stalled[0]
    assert any(m.startswith("Collective resumed") for m in messages)


# -- helper tasks that outlive their replica ----------------------------------------------------


def _asyncio_only(backend: object) -> None:
    if backend == "trio":
        pytest.skip("trio tasks cannot outlive the nursery of their replica")


async def test_a_helper_parked_at_a_collective_of_a_failed_run_raises(
    anyio_backend: object,
) -> None:
    _asyncio_only(anyio_backend)
    s = strategy(2)
    helpers: list[asyncio.Future[Any]] = []

    async def step() -> None:
        ctx = context()
        if ctx.replica_id_in_sync_group == 1:
            await anyio.wait_all_tasks_blocked()  # replica 0's helper waits at "x"
            raise ValueError("boom")
        helpers.append(asyncio.ensure_future(ctx.all_reduce("sum", 1.0, name="x")))
        await anyio.sleep_forever()

    with anyio.fail_after(HANG_GUARD):
        with pytest.raises(ValueError, match="boom"):
            await s.run(step)
        (helper,) = helpers
        with pytest.raises(ar.CollectiveError) as info:
            await helper
    first = str(info.value).splitlines()[0]
    assert first.startswith("The collective named 'x' (1st use) can never complete")
    assert "MirroredStrategy.run it belongs to failed (ValueError: boom)" in first
    assert "replica 1 never arrived at it" in str(info.value)


async def test_a_helper_parked_at_a_collective_of_a_cancelled_run_raises(
    anyio_backend: object,
) -> None:
    _asyncio_only(anyio_backend)
    s = strategy(2)
    helpers: list[asyncio.Future[Any]] = []

    async def step() -> None:
        ctx = context()
        if ctx.replica_id_in_sync_group == 0:
            helpers.append(asyncio.ensure_future(ctx.all_reduce("sum", 1.0, name="x")))
        await anyio.sleep_forever()

    with anyio.fail_after(HANG_GUARD):
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(s.run, step)
                await anyio.wait_all_tasks_blocked()
                scope.cancel()
        (helper,) = helpers
        with pytest.raises(ar.CollectiveError) as info:
            await helper
    first = str(info.value).splitlines()[0]
    assert "can never complete: the MirroredStrategy.run it belongs to was cancelled" in first
    assert "replica 1 never arrived at it" in str(info.value)


async def test_other_helpers_of_a_failed_run_are_cancelled_and_nothing_is_left_pending(
    anyio_backend: object,
) -> None:
    _asyncio_only(anyio_backend)
    s = strategy(2)
    sleepers: list[asyncio.Future[Any]] = []
    reported: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))

    async def step() -> None:
        ctx = context()
        sleepers.append(asyncio.ensure_future(asyncio.sleep(3600)))
        asyncio.ensure_future(ctx.all_reduce("sum", 1.0, name="x"))  # noqa: RUF006 (never awaited)
        await asyncio.sleep(0)
        if ctx.replica_id_in_sync_group == 1:
            await ctx.all_reduce("sum", 1.0, name="y")
        raise ValueError("boom")

    try:
        with anyio.fail_after(HANG_GUARD):
            with pytest.raises(ValueError, match="boom"):
                await s.run(step)
            for sleeper in sleepers:
                with pytest.raises(asyncio.CancelledError):
                    await sleeper
            for _ in range(3):
                await asyncio.sleep(0)
        sleepers.clear()
        gc.collect()
    finally:
        loop.set_exception_handler(previous)
    assert reported == []


async def test_a_helper_left_running_by_a_successful_run_finishes_and_cannot_issue_more(
    anyio_backend: object,
) -> None:
    _asyncio_only(anyio_backend)
    s = strategy(2)
    go = asyncio.Event()
    helpers: list[asyncio.Future[Any]] = []

    async def later(ctx: ar.ReplicaContext) -> object:
        await go.wait()
        return await ctx.all_reduce("sum", 1.0)

    async def step() -> None:
        helpers.append(asyncio.ensure_future(later(context())))

    with anyio.fail_after(HANG_GUARD):
        await s.run(step)
        assert not any(helper.done() for helper in helpers)  # not cancelled: the run succeeded
        go.set()
        for helper in helpers:
            with pytest.raises(ar.ReplicaContextError, match=r"whose Strategy\.run has finished"):
                await helper
