"""A helper task's collectives carry the line that started the task.

A collective issued inside a task the replica started has that task's own frames on
its stack, not the line that started the task. Two tasks of one helper started from
two lines in swapped order per replica would otherwise pair silently: the wrong sums.
The call path therefore goes on, past the task's own frames, with the call path of the
line that created the task (asyncio's task factory, trio's ``task_spawned``).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._runtime import _inspect

pytestmark = pytest.mark.anyio


def _here() -> int:
    return inspect.currentframe().f_back.f_lineno  # type: ignore[union-attr]


LINES: dict[str, int] = {}


async def _reduce(x: Any) -> Any:
    return await ar.get_replica_context().all_reduce("SUM", x)  # type: ignore[union-attr]


# -- ways to run _reduce in a task of its own, each started from one line ---------------


async def in_task_group(x: Any) -> Any:
    async with anyio.create_task_group() as tg:
        tg.start_soon(_reduce, x)


async def in_create_task(x: Any) -> Any:
    return await asyncio.create_task(_reduce(x))


async def in_ensure_future(x: Any) -> Any:
    return await asyncio.ensure_future(_reduce(x))


async def in_gather(x: Any) -> Any:
    return (await asyncio.gather(_reduce(x)))[0]


async def in_wait_for(x: Any) -> Any:
    # On Python 3.11 wait_for runs the coroutine in a task of its own.
    return await asyncio.wait_for(_reduce(x), 60)


async def in_nested_tasks(x: Any) -> Any:
    # A task started by a helper task: both starting lines are on the path.
    async with anyio.create_task_group() as tg:
        tg.start_soon(in_task_group, x)


FORMS: dict[str, Callable[[Any], Awaitable[Any]]] = {
    "task group": in_task_group,
    "create_task": in_create_task,
    "ensure_future": in_ensure_future,
    "gather": in_gather,
    "wait_for": in_wait_for,
    "nested": in_nested_tasks,
}
ASYNCIO_ONLY = {"create_task", "ensure_future", "gather", "wait_for"}


def _forms(backend: str) -> list[str]:
    return [f for f in FORMS if backend == "asyncio" or f not in ASYNCIO_ONLY]


async def _swapped(form: str) -> None:
    start = FORMS[form]
    ctx = ar.get_replica_context()
    assert ctx is not None
    g, loss = np.full(2, 1.0), np.full(2, 10.0)
    if ctx.replica_id_in_sync_group == 0:
        LINES["first"] = _here() + 1
        await start(g)
        await start(loss)
    else:
        LINES["second"] = _here() + 1
        await start(loss)
        await start(g)


@pytest.mark.parametrize("form", list(FORMS))
async def test_helper_tasks_started_in_swapped_order_are_a_call_site_mismatch(
    form: str, anyio_backend_name: str
) -> None:
    if form not in _forms(anyio_backend_name):
        pytest.skip(f"{form} is asyncio's")
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    with pytest.raises(ar.CollectiveMismatchError) as info:
        await strategy.run(_swapped, args=(form,))
    text = str(info.value)
    assert "call site differs" in text
    # Each replica's path goes on to the line of _swapped that started its first task.
    assert f"test_spawn_path.py:{LINES['first']}" in text
    assert f"test_spawn_path.py:{LINES['second']}" in text


async def _agreeing(form: str) -> Any:
    start = FORMS[form]
    ctx = ar.get_replica_context()
    assert ctx is not None
    x = np.full(2, float(ctx.replica_id_in_sync_group + 1))
    a = await start(x)
    b = await start(x * 10)
    return a, b


@pytest.mark.parametrize("form", list(FORMS))
async def test_helper_tasks_started_alike_run_and_sum_right(
    form: str, anyio_backend_name: str
) -> None:
    if form not in _forms(anyio_backend_name):
        pytest.skip(f"{form} is asyncio's")
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])
    result = await strategy.run(_agreeing, args=(form,))
    for a, b in strategy.experimental_local_results(result):
        if form in ("task group", "nested"):
            assert (a, b) == (None, None)  # a task group returns nothing
        else:
            assert a.tolist() == [6.0, 6.0]
            assert b.tolist() == [60.0, 60.0]
    assert not _inspect._spawned  # every entry went with its task


async def test_the_spawn_path_follows_the_task_path_and_is_interned(anyio_backend: str) -> None:
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    seen: list[tuple[Any, ...]] = []
    started: list[int] = []

    async def issue() -> None:
        collective = ar.get_replica_context().all_reduce("SUM", np.ones(1))  # type: ignore[union-attr]
        seen.append(collective.signature.call_path)  # type: ignore[attr-defined]
        await collective

    async def step() -> None:
        for _ in range(2):
            async with anyio.create_task_group() as tg:
                started.append(_here() + 1)
                tg.start_soon(issue)

    await strategy.run(step)
    assert [site.function for site in seen[0]] == ["issue", "step"]
    assert seen[0][1].lineno == started[0]
    # One interned path for every task started from that line: an identity check.
    assert all(path is seen[0] for path in seen)


async def test_tasks_started_outside_replicas_get_no_spawn_path(anyio_backend: str) -> None:
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])

    async def step() -> Any:
        return await _reduce(np.ones(1))

    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.sleep, 0)  # a task of the test's own, before the run
        await strategy.run(step)
    assert not _inspect._spawned


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_helper_task_that_outlives_the_run_keeps_its_entry_until_it_ends() -> None:
    # After a successful run, helper tasks are left to finish (docs/hangs.md); the
    # entry goes when the task ends, and holds the task only weakly meanwhile.
    strategy = ar.MirroredStrategy(["CPU:0"])
    tasks: list[asyncio.Task[None]] = []
    release = asyncio.Event()

    async def step() -> Any:
        tasks.append(asyncio.create_task(release.wait()))  # type: ignore[arg-type]
        return await _reduce(np.ones(1))

    await strategy.run(step)
    assert len(_inspect._spawned) == 1
    entry = next(iter(_inspect._spawned.values()))
    assert entry[0]() is tasks[0]  # a weak reference
    release.set()
    await tasks[0]
    await asyncio.sleep(0)  # the done callbacks run
    assert not _inspect._spawned
