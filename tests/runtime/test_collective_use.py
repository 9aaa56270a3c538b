"""Every use of a collective, started or not, is its own replica's: await, send, throw, close.

The checks of tests/runtime/test_ownership.py, once the collective is in flight (its
coroutine exists), and for the coroutine protocol a task drives it by (``send``,
``throw``, ``close``): each program here used to hang, corrupt the event loop's state,
or hand one replica another's result. It also covers tasks started by one replica's code
in a copy of another replica's context: who created a task decides whose it is.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import numpy as np
import pytest

import asyncreplica as ar

pytestmark = pytest.mark.anyio

HANG_GUARD = 10.0
FAILED = (ar.AsyncReplicaError, RuntimeError, BaseExceptionGroup)
# Ways to take the general path, where awaiting a collective creates its coroutine
# (trio always takes it): a shuffled schedule, a timeout.
SLOW: dict[str, dict[str, Any]] = {
    "random": {"schedule": "random"},
    "timeout": {"communication_options": ar.CommunicationOptions(timeout_seconds=HANG_GUARD)},
}


def _strategy(**kwargs: Any) -> ar.MirroredStrategy:
    return ar.MirroredStrategy(["CPU:0", "CPU:1"], **kwargs)


def _ctx() -> ar.ReplicaContext:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return ctx


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def _only(error: BaseException, kind: type[BaseException]) -> str:
    leaves = _leaves(error)
    assert leaves
    assert all(isinstance(leaf, kind) for leaf in leaves), leaves
    return "\n".join(str(leaf) for leaf in leaves)


async def _settle() -> None:
    for _ in range(5):
        await anyio.lowlevel.checkpoint()


def _results(strategy: ar.MirroredStrategy, result: Any) -> list[Any]:
    return [np.asarray(r).tolist() for r in strategy.experimental_local_results(result)]


# -- another replica's collective, once it is in flight ------------------------------------


@pytest.mark.parametrize("slow", list(SLOW))
async def test_a_collective_in_flight_awaited_by_another_replica_is_refused(
    anyio_backend: Any, slow: str
) -> None:
    # Replica 1 parks in its collective; replica 0 awaits the same object. It used to
    # drive replica 1's coroutine from its own task: a hang on asyncio, "cannot reuse
    # already awaited coroutine" on trio.
    shared: dict[int, Any] = {}
    parked = anyio.Event()

    async def step() -> Any:
        ctx = _ctx()
        mine: Any = ctx.all_reduce("SUM", np.ones(2))
        if ctx.replica_id_in_sync_group == 1:
            shared[1] = mine
            parked.set()
            return await mine
        await parked.wait()
        await _settle()
        return await shared[1]

    with anyio.fail_after(HANG_GUARD), pytest.raises(FAILED) as info:
        await _strategy(**SLOW[slow]).run(step)
    text = _only(info.value, ar.ReplicaContextError)
    assert "Replica 0 awaited a collective that replica 1 issued" in text


@pytest.mark.parametrize("started", [True, False], ids=["in_flight", "not_started"])
@pytest.mark.parametrize("use", ["close", "throw", "send"])
async def test_another_replicas_collective_cannot_be_closed_or_driven(
    anyio_backend: Any, use: str, started: bool
) -> None:
    shared: dict[int, Any] = {}
    ready = anyio.Event()
    raised: list[BaseException] = []

    async def step() -> Any:
        ctx = _ctx()
        mine: Any = ctx.all_reduce("SUM", np.ones(2))
        if ctx.replica_id_in_sync_group == 1:
            shared[1] = mine
            ready.set()
            if started:
                return await mine
            await anyio.sleep_forever()
        await ready.wait()
        await _settle()
        theirs = shared[1]
        try:
            if use == "close":
                theirs.close()
            elif use == "throw":
                theirs.throw(ValueError("from replica 0"))
            else:
                theirs.send(None)
        except BaseException as exc:
            raised.append(exc)
            raise
        return await mine

    with anyio.fail_after(HANG_GUARD), pytest.raises(FAILED) as info:
        await _strategy(schedule="random").run(step)
    assert len(raised) == 1
    assert isinstance(raised[0], ar.ReplicaContextError)
    verb = {"close": "closed", "throw": "called throw() on", "send": "called send() on"}[use]
    assert f"Replica 0 {verb} a collective that replica 1 issued" in str(raised[0])
    assert "ReplicaContextError" in {type(e).__name__ for e in _leaves(info.value)}


async def test_a_thread_awaiting_a_collective_in_flight_is_refused(anyio_backend: Any) -> None:
    # A worker thread's own event loop awaits the collective that the replica's helper
    # is parked in: refused in the thread, and the run goes on.
    from_thread: list[str] = []
    in_flight = anyio.Event()

    async def step() -> Any:
        ctx = _ctx()
        replica = ctx.replica_id_in_sync_group
        if replica == 1:
            await in_flight.wait()
        mine: Any = ctx.all_reduce("SUM", np.full(2, float(replica + 1)))
        result: dict[str, Any] = {}

        async def own() -> None:
            if replica == 0:
                in_flight.set()
            result["own"] = await mine

        def in_a_thread() -> None:
            async def take() -> Any:
                return await mine

            try:
                asyncio.run(take())
            except ar.ReplicaContextError as exc:
                from_thread.append(f"{threading.current_thread() is not main}: {exc}")

        async with anyio.create_task_group() as tg:
            tg.start_soon(own)
            if replica == 0:
                await in_flight.wait()
                await _settle()
                await anyio.to_thread.run_sync(in_a_thread)
        return result["own"]

    main = threading.current_thread()
    strategy = _strategy(schedule="random")
    with anyio.fail_after(HANG_GUARD):
        result = await strategy.run(step)
    assert _results(strategy, result) == [[3.0, 3.0]] * 2
    assert len(from_thread) == 1
    assert from_thread[0].startswith("True: A collective was awaited (all_reduce(SUM)")
    assert "in a thread other than the event loop's" in from_thread[0]


# -- the replica's own second use ----------------------------------------------------------


@pytest.mark.parametrize("first", ["await", "task"])
async def test_a_second_await_while_in_flight_is_refused(anyio_backend: Any, first: str) -> None:
    if first == "task" and anyio_backend == "trio":
        pytest.skip("a collective runs as a task's own coroutine on asyncio")

    # Two helpers of one replica await one collective: it used to corrupt trio's cancel
    # scopes and hang asyncio with a shuffled schedule.
    async def step() -> Any:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 1:
            await anyio.sleep_forever()  # replica 0's collective stays in flight
        mine: Any = ctx.all_reduce("SUM", np.ones(2))

        async def await_it() -> None:
            await mine

        async def again() -> None:
            await mine

        tasks: list[asyncio.Future[Any]] = []

        async with anyio.create_task_group() as tg:
            if first == "await":
                tg.start_soon(await_it)
            else:
                # The collective runs as the task's own coroutine (send and throw).
                tasks.append(asyncio.ensure_future(mine))
            await _settle()
            tg.start_soon(again)

    with anyio.fail_after(HANG_GUARD), pytest.raises(FAILED) as info:
        await _strategy(schedule="random").run(step)
    text = _only(info.value, ar.CollectiveError)
    how = "is being awaited" if first == "await" else "runs as a task"
    assert "Replica 0 awaited all_reduce(SUM) on float64[2] at " in text
    assert f"while it {how} elsewhere in the replica" in text


async def test_a_completed_collective_awaited_again_is_refused_where_it_happens(
    anyio_backend: Any,
) -> None:
    messages: list[str] = []

    async def step() -> Any:
        mine: Any = _ctx().all_reduce("SUM", np.ones(2))
        result = await mine
        for again in (lambda: mine.send(None), lambda: mine.throw(ValueError("x"))):
            with pytest.raises(ar.CollectiveError, match="again, after it completed") as e:
                again()
            messages.append(str(e.value))
        with pytest.raises(ar.CollectiveError, match=r"awaited all_reduce.* again") as e:
            await mine
        messages.append(str(e.value))
        mine.close()  # closing a completed collective does nothing, as for a coroutine
        return result

    for kwargs in ({}, SLOW["random"]):
        strategy = _strategy(**kwargs)
        with anyio.fail_after(HANG_GUARD):
            result = await strategy.run(step)
        assert _results(strategy, result) == [[2.0, 2.0]] * 2
    assert len(messages) == 12
    assert not any("cannot reuse" in m for m in messages)


async def test_send_by_hand_is_refused_and_leaves_the_collective_intact(
    anyio_backend: Any,
) -> None:
    # It used to run the collective's coroutine outside the event loop's control: trio's
    # TrioInternalError, asyncio's "await wasn't used with future".
    messages: list[str] = []

    async def step() -> Any:
        mine: Any = _ctx().all_reduce("SUM", np.ones(2))
        for by_hand in (lambda: mine.send(None), lambda: mine.throw(ValueError("x"))):
            with pytest.raises(ar.CollectiveError, match="by hand") as e:
                by_hand()
            messages.append(str(e.value))
        return await mine

    strategy = _strategy()
    with anyio.fail_after(HANG_GUARD):
        result = await strategy.run(step)
    assert _results(strategy, result) == [[2.0, 2.0]] * 2
    assert len(messages) == 4
    for replica in (0, 1):
        assert any(f"Replica {replica} called send() on all_reduce(SUM) on" in m for m in messages)
        assert any(f"Replica {replica} called throw() on all_reduce(SUM) on" in m for m in messages)


async def test_a_closed_collective_is_no_longer_pending_and_never_runs(
    anyio_backend: Any,
) -> None:
    messages: list[str] = []

    async def step() -> Any:
        ctx = _ctx()
        dropped: Any = ctx.all_reduce("SUM", np.full(2, 100.0), name="dropped")
        dropped.close()
        dropped.close()  # again: nothing
        messages.append(repr(dropped))
        with pytest.raises(ar.CollectiveError, match="which it closed") as e:
            await dropped
        messages.append(str(e.value))
        # Neither "awaited before ... which it issued earlier" nor "named 'dropped' in
        # flight": the closed collective is gone.
        first = await ctx.all_reduce("SUM", np.ones(2))
        second = await ctx.all_reduce("SUM", np.ones(2), name="dropped")
        return first + second

    strategy = _strategy()
    with anyio.fail_after(HANG_GUARD):
        result = await strategy.run(step)
    assert _results(strategy, result) == [[4.0, 4.0]] * 2
    assert sum(m.endswith("(closed)>") for m in messages) == 2
    for replica in (0, 1):
        assert f"Replica {replica} awaited all_reduce(SUM, name='dropped') on" in "".join(messages)


async def test_a_collective_in_flight_cannot_be_closed_by_its_replica(
    anyio_backend: Any,
) -> None:
    tried = anyio.Event()
    messages: list[str] = []

    async def step() -> Any:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 1:
            await tried.wait()
        mine: Any = ctx.all_reduce("SUM", np.ones(2))
        result: list[Any] = []

        async def own() -> None:
            result.append(await mine)

        async with anyio.create_task_group() as tg:
            tg.start_soon(own)
            await _settle()
            if ctx.replica_id_in_sync_group == 0:
                with pytest.raises(ar.CollectiveError, match="while it is in flight") as e:
                    mine.close()
                messages.append(str(e.value))
                tried.set()
        return result[0]

    strategy = _strategy(schedule="random")
    with anyio.fail_after(HANG_GUARD):
        result = await strategy.run(step)
    assert _results(strategy, result) == [[2.0, 2.0]] * 2
    assert len(messages) == 1


async def test_a_collective_of_an_earlier_run_is_refused_as_such(anyio_backend: Any) -> None:
    stash: dict[int, Any] = {}

    async def leave() -> Any:
        ctx = _ctx()
        stash[ctx.replica_id_in_sync_group] = ctx.all_reduce("SUM", np.ones(2), name="later")
        return await ctx.all_reduce("SUM", np.ones(2))

    async def use_stale() -> Any:
        return await stash[_ctx().replica_id_in_sync_group]

    strategy = _strategy()
    with anyio.fail_after(HANG_GUARD), pytest.raises(FAILED):
        await strategy.run(leave)  # the named one is left unawaited: that run fails
    with anyio.fail_after(HANG_GUARD), pytest.raises(FAILED) as info:
        await strategy.run(use_stale)
    text = _only(info.value, ar.ReplicaContextError)
    assert "was awaited after the MirroredStrategy.run that issued it ended" in text
    assert "asyncio" not in text


# -- tasks started in a copy of another replica's context ---------------------------------


@pytest.mark.parametrize("what", ["await", "issue"])
async def test_a_task_started_in_a_copy_of_another_replicas_context_is_its_creators(
    anyio_backend: Any, what: str
) -> None:
    # Replica 0 starts a task in a copy of replica 1's context: it used to count as
    # replica 1's and take replica 1's result (or issue replica 1's collective).
    shared: dict[int, Any] = {}
    contexts: dict[int, contextvars.Context] = {}
    ready = anyio.Event()
    taken: list[Any] = []

    async def grab() -> None:
        if what == "await":
            taken.append(await shared[1])
        else:
            taken.append(await _ctx().all_reduce("SUM", np.full(1, 100.0)))

    async def step() -> Any:
        ctx = _ctx()
        r = ctx.replica_id_in_sync_group
        mine = ctx.reduce_scatter("SUM", np.array([1.0, 10.0]) * (r + 1), axis=0)
        if r == 1:
            shared[1], contexts[1] = mine, contextvars.copy_context()
            ready.set()
            await anyio.sleep_forever()
        await ready.wait()
        async with anyio.create_task_group() as tg:
            contexts[1].run(tg.start_soon, grab)
            return await mine

    with anyio.fail_after(HANG_GUARD), pytest.raises(FAILED) as info:
        await _strategy().run(step)
    assert not taken
    text = _only(info.value, ar.ReplicaContextError)
    if what == "await":
        assert "Replica 0 awaited a collective that replica 1 issued" in text
    else:
        assert "Replica 0's task issued all_reduce(SUM) on float64[1]" in text
        assert "for replica 1" in text


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("how", ["asyncio.Task", "call_soon"])
async def test_an_unseen_task_in_a_copy_of_another_replicas_context_is_refused(how: str) -> None:
    # asyncio.Task(coro, context=...) and a callback's task are not seen created: who
    # started them is unknown, so they may not await a replica's collective.
    shared: dict[int, Any] = {}
    contexts: dict[int, contextvars.Context] = {}
    ready = anyio.Event()

    async def step() -> Any:
        ctx = _ctx()
        r = ctx.replica_id_in_sync_group
        mine = ctx.reduce_scatter("SUM", np.array([1.0, 10.0]) * (r + 1), axis=0)
        if r == 1:
            shared[1], contexts[1] = mine, contextvars.copy_context()
            ready.set()
            await anyio.sleep_forever()
        await ready.wait()

        async def grab() -> Any:
            return await shared[1]

        loop = asyncio.get_running_loop()
        if how == "asyncio.Task":
            task = asyncio.Task(grab(), context=contexts[1])
        else:
            made: asyncio.Future[asyncio.Task[Any]] = loop.create_future()
            loop.call_soon(lambda: made.set_result(loop.create_task(grab())), context=contexts[1])
            task = await made
        await mine
        return await task

    with anyio.fail_after(HANG_GUARD), pytest.raises(FAILED) as info:
        await _strategy().run(step)
    text = _only(info.value, ar.ReplicaContextError)
    assert "A collective of replica 1 (reduce_scatter(SUM, axis=0)" in text
    assert "was awaited by a task that is not one of the replica's" in text
