"""A collective is issued and awaited by its own replica's tasks, on the run's thread.

Each test here is a program that used to hang or pair collectives silently: a
collective object shared between replicas, collectives issued from worker threads,
helper tasks whose creation the run did not see, a task factory the user sets during a
run, unnamed collectives awaited in another order than they were created, two uses of
one name in flight at once. Each now raises an error that names what happened, or runs
correctly.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._runtime import _tasks

pytestmark = pytest.mark.anyio

HANG_GUARD = 10.0
# What a failed run raises: one replica's error, or a group of several replicas' (or,
# around a task group of the test's own, a group of the run's error).
FAILED = (ar.AsyncReplicaError, RuntimeError, BaseExceptionGroup)


def _strategy(n: int = 2, **kwargs: Any) -> ar.MirroredStrategy:
    return ar.MirroredStrategy([f"CPU:{i}" for i in range(n)], **kwargs)


def _ctx() -> ar.ReplicaContext:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return ctx


def _leaves(error: BaseException) -> list[BaseException]:
    """The errors in ``error``: a single one, or every one of a (nested) group."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def _only(error: BaseException, kind: type[BaseException]) -> str:
    """The text of every error in ``error``, each of which is a ``kind``."""
    leaves = _leaves(error)
    assert leaves
    assert all(isinstance(leaf, kind) for leaf in leaves), leaves
    return "\n".join(str(leaf) for leaf in leaves)


# -- a collective awaited by another replica -----------------------------------------


async def test_a_collective_awaited_by_another_replica_is_refused(anyio_backend: str) -> None:
    shared: dict[int, Any] = {}
    ready = anyio.Event()

    async def step() -> Any:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 0:
            shared[0] = ctx.all_reduce("SUM", np.ones(2))
            ready.set()
            for _ in range(3):
                await anyio.lowlevel.checkpoint()
            return None
        await ready.wait()
        return await shared[0]

    with anyio.fail_after(HANG_GUARD), pytest.raises(ar.ReplicaContextError) as info:
        await _strategy().run(step)
    text = str(info.value)
    assert "Replica 1 awaited a collective that replica 0 issued" in text
    assert "all_reduce(SUM)" in text


# -- worker threads ----------------------------------------------------------------------


async def test_a_collective_issued_in_a_worker_thread_is_refused(anyio_backend: str) -> None:
    async def step() -> Any:
        ctx = _ctx()
        collective = await anyio.to_thread.run_sync(ctx.all_reduce, "SUM", np.ones(2))
        return await collective

    with anyio.fail_after(HANG_GUARD), pytest.raises(FAILED) as info:
        await _strategy().run(step)
    assert "in a thread other than the event loop's" in _only(info.value, ar.ReplicaContextError)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_collective_issued_through_asyncio_to_thread_is_refused() -> None:
    async def step() -> Any:
        ctx = _ctx()
        value = np.ones(2) * (ctx.replica_id_in_sync_group + 1)
        collective = await asyncio.to_thread(ctx.all_reduce, "SUM", value)
        return await collective

    with anyio.fail_after(HANG_GUARD), pytest.raises(FAILED) as info:
        await _strategy().run(step)
    assert "asyncio.to_thread" in _only(info.value, ar.ReplicaContextError)


# -- tasks the run did not see created ------------------------------------------------------


async def _reduce(x: Any) -> Any:
    return await _ctx().all_reduce("SUM", x)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_helpers_created_with_asyncio_task_are_refused_not_paired() -> None:
    # Swapped per replica, these would pair g with loss: the line that started each task
    # is unknown, so their collectives are refused.
    async def step() -> Any:
        g, loss = np.ones(2), np.full(2, 10.0)
        first, second = (g, loss) if _ctx().replica_id_in_sync_group == 0 else (loss, g)
        a = await asyncio.Task(_reduce(first))
        b = await asyncio.Task(_reduce(second))
        return a, b

    with anyio.fail_after(HANG_GUARD), pytest.raises(FAILED) as info:
        await _strategy().run(step)
    text = _only(info.value, ar.CollectiveError)
    assert "in a task that the run did not see created" in text
    assert "asyncio.Task(coro)" in text


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_without_call_site_checks_asyncio_task_helpers_are_adopted() -> None:
    async def step() -> Any:
        x = np.full(2, float(_ctx().replica_id_in_sync_group + 1))
        return await asyncio.Task(_reduce(x))

    strategy = _strategy(3, check_call_sites=False)
    with anyio.fail_after(HANG_GUARD):
        result = await strategy.run(step)
    assert [r.tolist() for r in strategy.experimental_local_results(result)] == [[6.0, 6.0]] * 3


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_task_created_in_a_call_soon_callback_is_refused() -> None:
    async def step() -> Any:
        loop = asyncio.get_running_loop()
        made: asyncio.Future[asyncio.Task[Any]] = loop.create_future()
        x = np.ones(2)
        loop.call_soon(lambda: made.set_result(asyncio.ensure_future(_reduce(x))))
        return await (await made)

    with anyio.fail_after(HANG_GUARD), pytest.raises(FAILED) as info:
        await _strategy().run(step)
    assert "loop.call_soon" in _only(info.value, ar.CollectiveError)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_task_factory_set_during_a_run_is_chained_and_kept() -> None:
    loop = asyncio.get_running_loop()
    created: list[Any] = []

    def user_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        created.append(coro)
        return asyncio.Task(coro, loop=loop, **kwargs)

    async def step() -> Any:
        if _ctx().replica_id_in_sync_group == 0:
            loop.set_task_factory(user_factory)
        await anyio.lowlevel.checkpoint()
        first = await asyncio.create_task(_reduce(np.ones(2)))
        second = await asyncio.create_task(_reduce(np.ones(2)))
        return first, second

    before = loop.get_task_factory()
    try:
        with anyio.fail_after(HANG_GUARD), pytest.raises(FAILED) as info:
            await _strategy().run(step)
        # The task created under the user's factory was not seen: refused, and said why.
        text = _only(info.value, ar.CollectiveError)
        assert "loop.set_task_factory was called during this run" in text
        assert created  # the user's factory created tasks
        assert loop.get_task_factory() is user_factory  # and it is still there
    finally:
        loop.set_task_factory(before)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_task_factory_set_before_the_run_is_chained_and_restored_exactly() -> None:
    loop = asyncio.get_running_loop()
    created: list[Any] = []

    def user_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        created.append(coro)
        return asyncio.Task(coro, loop=loop, **kwargs)

    async def step() -> Any:
        x = np.full(2, float(_ctx().replica_id_in_sync_group + 1))
        return await asyncio.create_task(_reduce(x))

    before = loop.get_task_factory()
    loop.set_task_factory(user_factory)
    try:
        strategy = _strategy()
        with anyio.fail_after(HANG_GUARD):
            result = await strategy.run(step)
        assert [r.tolist() for r in strategy.experimental_local_results(result)] == [[3.0, 3.0]] * 2
        assert created
        assert loop.get_task_factory() is user_factory
    finally:
        loop.set_task_factory(before)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_task_factory_that_runs_coroutines_eagerly_is_refused_clearly() -> None:
    loop = asyncio.get_running_loop()

    def eager(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        # Runs the coroutine to its first suspension before returning a task for it, as
        # an eager task factory does.
        task = asyncio.Task(coro, loop=loop, **kwargs)
        with contextlib.suppress(StopIteration):
            coro.send(None)
        return task

    async def step() -> Any:
        return await _reduce(np.ones(2))

    before = loop.get_task_factory()
    loop.set_task_factory(eager)
    try:
        with anyio.fail_after(HANG_GUARD), pytest.raises(FAILED) as info:
            await _strategy().run(step)
    finally:
        loop.set_task_factory(before)
    assert "ran the coroutine before returning its task" in "\n".join(
        str(e) for e in _leaves(info.value)
    )


def test_asyncio_eager_task_factory_is_recognised() -> None:
    eager = getattr(asyncio, "eager_task_factory", None)
    if eager is None:
        pytest.skip("asyncio.eager_task_factory is Python 3.12's")
    assert _tasks._eager(eager)
    assert _tasks._eager(asyncio.create_eager_task_factory(asyncio.Task))  # type: ignore[attr-defined]


# -- helpers the run must watch, so as not to report a false deadlock ----------------------


async def test_tasks_started_in_a_task_group_passed_into_the_step_are_watched(
    anyio_backend: str,
) -> None:
    # trio's idiom: the step starts helpers in a nursery it was given. Replica 0's helper
    # issues "b" after a while; a run that did not watch it would report a deadlock when
    # both mains park.
    async def helper() -> None:
        await anyio.sleep(0.01)
        await _ctx().all_reduce("SUM", np.ones(2), name="b")

    async def step(group: anyio.abc.TaskGroup) -> Any:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 0:
            group.start_soon(helper)
            return await ctx.all_reduce("SUM", np.ones(2), name="a")
        await ctx.all_reduce("SUM", np.ones(2), name="b")
        return await ctx.all_reduce("SUM", np.ones(2), name="a")

    strategy = _strategy()
    with anyio.fail_after(HANG_GUARD):
        async with anyio.create_task_group() as group:
            result = await strategy.run(step, args=(group,))
    assert [r.tolist() for r in strategy.experimental_local_results(result)] == [[2.0, 2.0]] * 2


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_helper_in_a_passed_nursery_that_swaps_is_a_mismatch(anyio_backend: str) -> None:
    async def step(group: anyio.abc.TaskGroup) -> Any:
        g, loss = np.ones(2), np.full(2, 10.0)
        done = anyio.Event()

        async def helper(x: Any) -> None:
            await _reduce(x)
            done.set()

        if _ctx().replica_id_in_sync_group == 0:
            group.start_soon(helper, g)
        else:
            group.start_soon(helper, loss)
        await done.wait()

    with anyio.fail_after(HANG_GUARD), pytest.raises(FAILED) as info:
        async with anyio.create_task_group() as group:
            await _strategy().run(step, args=(group,))
    assert "call site differs" in _only(info.value, ar.CollectiveMismatchError)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_asyncio_task_helper_not_seen_is_watched_before_a_deadlock_is_reported() -> None:
    # With call sites unchecked, the helper's collectives are allowed; before it issues
    # one, the run must find it (by its context) rather than report a deadlock.
    async def helper() -> None:
        await asyncio.sleep(0.01)
        await _ctx().all_reduce("SUM", np.ones(2), name="b")

    tasks: list[asyncio.Task[None]] = []

    async def step() -> Any:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 0:
            tasks.append(asyncio.Task(helper()))
            return await ctx.all_reduce("SUM", np.ones(2), name="a")
        await ctx.all_reduce("SUM", np.ones(2), name="b")
        return await ctx.all_reduce("SUM", np.ones(2), name="a")

    strategy = _strategy(check_call_sites=False)
    with anyio.fail_after(HANG_GUARD):
        result = await strategy.run(step)
    assert [r.tolist() for r in strategy.experimental_local_results(result)] == [[2.0, 2.0]] * 2
    await tasks[0]


# -- the call path and the position describe the same moment -------------------------------


async def test_unnamed_collectives_awaited_out_of_creation_order_are_refused(
    anyio_backend: str,
) -> None:
    async def step() -> Any:
        ctx = _ctx()
        g, loss = np.ones(2), np.full(2, 10.0)
        calls = [ctx.all_reduce("SUM", v) for v in (g, loss)]
        if ctx.replica_id_in_sync_group == 0:
            a = await calls[0]
            b = await calls[1]
        else:
            b = await calls[1]
            a = await calls[0]
        return a, b

    with anyio.fail_after(HANG_GUARD), pytest.raises(FAILED) as info:
        await _strategy().run(step)
    text = _only(info.value, ar.CollectiveError)
    assert "Replica 1 awaited" in text
    assert "which it issued earlier and has not awaited" in text


async def test_unnamed_collectives_created_together_and_awaited_in_order_run(
    anyio_backend: str,
) -> None:
    async def step() -> Any:
        ctx = _ctx()
        x = float(ctx.replica_id_in_sync_group + 1)
        calls = [ctx.all_reduce("SUM", np.full(2, v)) for v in (x, 10 * x)]
        return [(await c).tolist() for c in calls]

    strategy = _strategy()
    with anyio.fail_after(HANG_GUARD):
        result = await strategy.run(step)
    assert strategy.experimental_local_results(result) == ([[3.0, 3.0], [30.0, 30.0]],) * 2


# -- one name in flight at most once per replica ---------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_name_in_flight_twice_in_one_replica_is_refused() -> None:
    async def step() -> Any:
        ctx = _ctx()
        r = ctx.replica_id_in_sync_group
        first = ctx.all_reduce("SUM", np.full(2, 1.0 + r), name="x")
        second = ctx.all_reduce("SUM", np.full(2, 10.0 + r), name="x")
        return await asyncio.gather(second, first) if r else await asyncio.gather(first, second)

    with anyio.fail_after(HANG_GUARD), pytest.raises(FAILED) as info:
        await _strategy().run(step)
    text = _only(info.value, ar.CollectiveError)
    assert "while its collective named 'x' issued earlier" in text


async def test_a_name_reused_after_completion_is_allowed(anyio_backend: str) -> None:
    async def step() -> Any:
        ctx = _ctx()
        a = await ctx.all_reduce("SUM", np.ones(2), name="x")
        b = await ctx.all_reduce("SUM", np.ones(2) * 2, name="x")
        return a.tolist(), b.tolist()

    strategy = _strategy()
    with anyio.fail_after(HANG_GUARD):
        result = await strategy.run(step)
    assert strategy.experimental_local_results(result) == (([2.0, 2.0], [4.0, 4.0]),) * 2


async def test_named_collectives_with_distinct_names_may_be_in_flight_together(
    anyio_backend: str,
) -> None:
    async def step() -> Any:
        ctx = _ctx()
        results: list[Any] = [None, None]

        async def one(i: int) -> None:
            results[i] = (await ctx.all_reduce("SUM", np.full(2, float(i)), name=f"n{i}")).tolist()

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, 0)
            tg.start_soon(one, 1)
        return results

    strategy = _strategy()
    with anyio.fail_after(HANG_GUARD):
        result = await strategy.run(step)
    assert strategy.experimental_local_results(result) == ([[0.0, 0.0], [2.0, 2.0]],) * 2


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_collective_awaited_in_a_task_the_run_did_not_see_created_is_refused() -> None:
    # Who started an asyncio.Task(coro) is unknown (it may be another replica's code,
    # holding this replica's collective), so it may not await a replica's collective.
    async def step() -> Any:
        ctx = _ctx()
        x = np.full(2, float(ctx.replica_id_in_sync_group + 1))
        return await asyncio.Task(ctx.all_reduce("SUM", x))  # type: ignore[arg-type]

    with anyio.fail_after(HANG_GUARD), pytest.raises(FAILED) as info:
        await _strategy().run(step)
    text = _only(info.value, ar.ReplicaContextError)
    assert "was sent into (send()) by a task that is not one of the replica's" in text
    assert "asyncio.Task(coro) called directly" in text


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_eager_task_factory_is_set_aside_during_a_run_and_restored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Python 3.12's asyncio.eager_task_factory, played on 3.11 by a factory that runs
    # the coroutine to its first suspension (as the eager one does), under its name.
    loop = asyncio.get_running_loop()
    eagerly: list[Any] = []

    def eager(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        eagerly.append(coro)
        task = asyncio.Task(coro, loop=loop, **kwargs)
        with contextlib.suppress(StopIteration):
            coro.send(None)
        return task

    monkeypatch.setattr(asyncio, "eager_task_factory", eager, raising=False)

    async def step() -> Any:
        x = np.full(2, float(_ctx().replica_id_in_sync_group + 1))
        return await asyncio.create_task(_reduce(x))

    before = loop.get_task_factory()
    loop.set_task_factory(eager)
    try:
        strategy = _strategy()
        with anyio.fail_after(HANG_GUARD):
            result = await strategy.run(step)
        assert loop.get_task_factory() is eager
    finally:
        loop.set_task_factory(before)
    assert [r.tolist() for r in strategy.experimental_local_results(result)] == [[3.0, 3.0]] * 2
    assert not eagerly  # nothing of the run went through it
