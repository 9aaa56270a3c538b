"""What docs/hangs.md says asyncreplica cannot catch behaves as the page says.

Each test pins one sentence of "What asyncreplica cannot catch": if a later change
catches the case, the test fails and the page must move it to what is caught.
"""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

import asyncreplica as ar


def test_a_plain_merge_fn_that_blocks_holds_the_loop_and_no_timeout_fires() -> None:
    # "The same holds for a plain (not async) merge_fn that blocks: it runs on the loop,
    # so neither the stall warning nor timeout_seconds can fire while it runs."
    s = ar.MirroredStrategy(
        ["CPU:0", "CPU:1"],
        communication_options=ar.CommunicationOptions(timeout_seconds=0.05),
        stall_warning_seconds=0.01,
    )

    def merge_fn(strategy: ar.Strategy, value: object) -> float:
        time.sleep(0.3)  # blocking on purpose: it holds the whole loop
        return 7.0

    async def step() -> object:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.merge_call(merge_fn, args=(1.0,))

    started = time.perf_counter()
    result = asyncio.run(s.run(step))
    assert time.perf_counter() - started >= 0.3
    assert result == 7.0  # the same object for every replica: not wrapped


def test_a_thread_a_replica_awaits_keeps_running_after_the_run_failed() -> None:
    # "A thread that never finishes is a case for timeout_seconds, and the thread keeps
    # running after the run is cancelled."
    s = ar.MirroredStrategy(
        ["CPU:0", "CPU:1"], communication_options=ar.CommunicationOptions(timeout_seconds=0.05)
    )
    release = threading.Event()
    running = threading.Event()

    def blocked() -> float:
        running.set()
        release.wait(timeout=30)  # hang guard
        return 1.0

    async def step() -> object:
        ctx = ar.get_replica_context()
        assert ctx is not None
        value = 1.0
        if ctx.replica_id_in_sync_group == 1:
            value = await asyncio.to_thread(blocked)
        return await ctx.all_reduce("sum", np.float64(value))

    async def main() -> bool:
        with pytest.raises(ar.CollectiveTimeoutError) as info:
            await s.run(step)
        assert info.value.missing == {1}
        alive = running.is_set() and not release.is_set()
        release.set()  # let asyncio.run's executor shutdown join the thread
        return alive

    assert asyncio.run(main())


@pytest.mark.parametrize("how", ["Task", "create_task"])
def test_a_keyboard_interrupt_in_an_asyncio_task_helper_is_noted_only_when_seen_created(
    how: str,
) -> None:
    # "A KeyboardInterrupt or SystemExit in a task created with asyncio.Task(coro) ...
    # has no 'raised in a task started by replica k' note on it. It goes on as itself."
    s = ar.MirroredStrategy(["CPU:0", "CPU:1"])

    async def helper() -> None:
        raise KeyboardInterrupt("helper")

    async def step() -> object:
        if ar.get_replica_context().replica_id_in_sync_group == 0:  # type: ignore[union-attr]
            task = asyncio.Task(helper()) if how == "Task" else asyncio.create_task(helper())
            await task
        return 1.0

    with pytest.raises(KeyboardInterrupt, match="helper") as info:
        asyncio.run(s.run(step))
    notes = getattr(info.value, "__notes__", [])
    if how == "Task":
        assert not any("started by replica" in note for note in notes), notes
    else:
        assert any("started by replica 0 of 2" in note for note in notes), notes
