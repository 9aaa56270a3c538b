"""The private names of asyncio that deadlock detection reads are still there.

Deadlock detection sees through the ways a replica waits for its helpers by reading
asyncio's private names. These tests fail the day a Python release changes one of them
(instead of detection quietly seeing less), and a missing one is warned about when a
run starts, never passed over in silence.
"""

from __future__ import annotations

import asyncio
import types
import warnings
from typing import Any

import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._runtime import _tasks


def test_every_private_name_deadlock_detection_reads_is_there() -> None:
    assert _tasks.asyncio_internals_missing() == []


def test_the_private_names_mean_what_detection_reads_them_for() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        blocker: asyncio.Future[None] = loop.create_future()

        async def wait_on_it() -> None:
            await blocker

        child = asyncio.ensure_future(wait_on_it())
        gathered = asyncio.gather(child)
        shielded = asyncio.shield(child)
        joiner = asyncio.ensure_future(asyncio.wait([child]))
        await asyncio.sleep(0)
        # Task._fut_waiter: the future a task awaits.
        assert child._fut_waiter is blocker  # type: ignore[attr-defined]
        # _GatheringFuture._children: what gather waits for.
        assert gathered._children == [child]  # type: ignore[attr-defined]
        # shield's callback, found on the inner future's callbacks, holds the inner one.
        assert _tasks._shielded(shielded) is child
        # asyncio.wait's frame: its locals say what it waits for and how.
        frames, _ = _tasks._chain(joiner)
        wait_frames = [f for f in frames if f.f_code is _tasks._WAIT_CODE]
        assert wait_frames, [f.f_code.co_qualname for f in frames]
        local = wait_frames[0].f_locals
        assert local["waiter"] is joiner._fut_waiter  # type: ignore[attr-defined]
        assert local["timeout"] is None
        assert list(local["fs"]) == [child]
        assert local["return_when"] == asyncio.ALL_COMPLETED
        # The task's wake-up callback carries its context (read on Python 3.11).
        assert any(
            getattr(callback, "__self__", None) is child
            for callback, _ in blocker._callbacks  # type: ignore[attr-defined]
        )
        blocker.set_result(None)
        await asyncio.gather(joiner, gathered, shielded)

    asyncio.run(main())


def test_current_tasks_is_the_dict_the_run_reads_where_current_task_is_python() -> None:
    if not isinstance(asyncio.current_task, types.FunctionType):
        pytest.skip("asyncio.current_task is C code here: the run calls it")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        current = asyncio.tasks._current_tasks  # type: ignore[attr-defined]
        assert isinstance(current, dict)
        assert current.get(loop) is asyncio.current_task()

    asyncio.run(main())


def test_a_missing_private_name_is_warned_about_when_a_run_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_tasks, "_WAIT_CODE", None)
    monkeypatch.setattr(_tasks, "_warned_internals", False)
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])

    async def step() -> Any:
        return await ar.get_replica_context().all_reduce("SUM", np.ones(1))  # type: ignore[union-attr]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(strategy.run(step))
        asyncio.run(strategy.run(step))
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1, messages  # once per process
    assert "asyncio.tasks._wait's locals" in messages[0]
    assert "timeout_seconds" in messages[0]
