"""Per-replica work that does not grow with the replicas, on each loop (issue 17, item 3).

Counted, never timed: wall-clock figures are `asyncreplica bench`'s scale rows.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import numpy as np
import pytest
import trio

import asyncreplica as ar
from asyncreplica._runtime import _run, _tasks


def test_trio_arrivals_do_not_ask_asyncio_for_the_current_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The generic helper tries asyncio first, which on trio raises and catches a
    # RuntimeError: once per waiting replica and collective, it was several times
    # the cost of asking trio.
    calls: list[int] = []
    generic = _run._tasks.current_task

    def counting() -> Any:
        calls.append(1)
        return generic()

    monkeypatch.setattr(_run._tasks, "current_task", counting)
    n, rounds = 4, 10

    async def step(x: np.ndarray) -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        for _ in range(rounds):
            await ctx.all_reduce(ar.ReduceOp.SUM, x)

    strategy = ar.MirroredStrategy([f"CPU:{i}" for i in range(n)])
    values = ar.PerReplica([np.ones(2, np.float32) for _ in range(n)])

    async def main() -> None:
        await strategy.run(step, args=(values,))

    trio.run(main)
    assert calls == []


def test_the_current_task_on_trio_is_found_without_raising() -> None:
    # _tasks.current_task runs once per collective of a helper task that has a start
    # path (the call-path capture). On trio it asked asyncio first, which raised and
    # caught a RuntimeError each time: several times the cost of asking trio.
    raised: list[str] = []

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if event == "exception":
            raised.append(f"{frame.f_code.co_name}: {arg[0].__name__}")
        return tracer

    async def main() -> None:
        sys.settrace(tracer)
        try:
            found = _tasks.current_task()
        finally:
            sys.settrace(None)
        assert found is trio.lowlevel.current_task()

    trio.run(main)
    assert raised == []


def test_the_current_task_is_the_running_loops() -> None:
    async def on_asyncio() -> None:
        assert _tasks.current_task() is asyncio.current_task()

        async def inner() -> object:
            return _tasks.current_task()

        task = asyncio.create_task(inner())
        assert await task is task

    asyncio.run(on_asyncio())

    async def on_trio() -> None:
        assert _tasks.current_task() is trio.lowlevel.current_task()
        found: list[object] = []

        async def inner() -> None:
            found.append((_tasks.current_task(), trio.lowlevel.current_task()))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(inner)
        ((ours, theirs),) = found
        assert ours is theirs

    trio.run(on_trio)
