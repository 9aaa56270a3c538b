"""Replica endings, third round (issue 23): every way a replica ends is told as it happened.

Each test failed before its fix: a replica cancelled in the same turn as another was told
as waiting (or not at all), a cancellation inside the backend's combine hung the run or
returned values that disagree, and the other findings listed at each section.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import re
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from asyncreplica_numpy import NumpyBackend

import asyncreplica as ar
from asyncreplica._runtime import _ending

pytestmark = pytest.mark.anyio

DEVICES = ["CPU:0", "CPU:1", "CPU:2"]
SLOW = ar.CommunicationOptions(timeout_seconds=60)  # a timeout: the slow path


def strategy(n: int = 3, **kwargs: Any) -> ar.MirroredStrategy:
    return ar.MirroredStrategy(DEVICES[:n], **kwargs)


def _ctx() -> ar.ReplicaContext:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return ctx


def _is_trio(anyio_backend: object) -> bool:
    return anyio_backend == "trio" or (
        isinstance(anyio_backend, tuple) and anyio_backend[0] == "trio"
    )


@pytest.fixture
def asyncio_only(anyio_backend: object) -> None:
    if _is_trio(anyio_backend):
        pytest.skip("trio has no task.cancel(): a trio task is only cancelled by its scopes")


def _states(error: BaseException) -> list[str]:
    report = getattr(error, "report", None)
    assert report is not None
    return [row.state.value for row in report.rows]


# -- 1: two replicas cancelled in one turn ------------------------------------------------


@pytest.mark.parametrize("options", [None, SLOW], ids=["fast", "slow"])
async def test_two_replicas_cancelled_at_a_collective_in_one_turn_are_both_cancelled(
    options: ar.CommunicationOptions | None,
) -> None:
    # Before (trio, and asyncio's slow path): "replica 2 waits there", its row "waiting".
    scopes: dict[int, anyio.CancelScope] = {}

    async def step() -> object:
        ctx = _ctx()
        rid = ctx.replica_id_in_sync_group
        if rid == 0:
            while len(scopes) < 2:
                await anyio.lowlevel.checkpoint()
            await anyio.lowlevel.checkpoint()  # both park
            scopes[1].cancel()
            scopes[2].cancel()
            await anyio.sleep_forever()
        with anyio.CancelScope() as scope:
            scopes[rid] = scope
            return await ctx.all_reduce("SUM", 1.0, options=options)
        return "cancelled"

    with anyio.fail_after(10), pytest.raises(ar.CollectiveError) as info:
        await strategy().run(step)
    message = str(info.value)
    # Trio may resume either first: the error is the first one's, naming the other.
    assert re.match(
        r"Replica (1|2) was cancelled while waiting at its 1st collective \(position 0\); "
        r"replica (1|2) was cancelled there too: the collective can never complete\.",
        message,
    )
    assert "waits there" not in message
    assert _states(info.value) == ["running", "cancelled", "cancelled"]


@pytest.mark.usefixtures("asyncio_only")
@pytest.mark.parametrize("options", [None, SLOW], ids=["fast", "slow"])
async def test_two_parked_replica_tasks_cancelled_in_one_turn_are_both_cancelled(
    options: ar.CommunicationOptions | None,
) -> None:
    tasks: dict[int, asyncio.Task[Any]] = {}

    async def step() -> object:
        ctx = _ctx()
        rid = ctx.replica_id_in_sync_group
        task = asyncio.current_task()
        assert task is not None
        tasks[rid] = task
        if rid == 0:
            await asyncio.sleep(0)
            await asyncio.sleep(0)  # replicas 1 and 2 park
            tasks[1].cancel()
            tasks[2].cancel()
            await asyncio.sleep(0)
        return await ctx.all_reduce("SUM", 1.0, options=options)

    with anyio.fail_after(10), pytest.raises(ar.CollectiveError) as info:
        await strategy().run(step)
    assert "replica 2 was cancelled there too" in str(info.value)
    assert _states(info.value) == ["running", "cancelled", "cancelled"]


@pytest.mark.usefixtures("asyncio_only")
async def test_two_replica_tasks_cancelled_away_from_collectives_are_both_reported() -> None:
    # Before: only replica 1 was reported; replica 2's cancellation, asked for first, was
    # taken for the run's own (the run's scope was cancelled by then).
    tasks: dict[int, asyncio.Task[Any]] = {}
    gate = asyncio.Event()

    async def step() -> object:
        ctx = _ctx()
        rid = ctx.replica_id_in_sync_group
        task = asyncio.current_task()
        assert task is not None
        tasks[rid] = task
        if rid == 0:
            await asyncio.sleep(0)
            tasks[1].cancel()
            tasks[2].cancel()
            await asyncio.sleep(0)
        else:
            await gate.wait()
        return await ctx.all_reduce("SUM", 1.0)

    with anyio.fail_after(10), pytest.raises(ExceptionGroup) as info:
        await strategy().run(step)
    errors = info.value.exceptions
    assert [type(e) for e in errors] == [ar.ReplicaCancelledError] * 2
    assert [e.replica_id for e in errors] == [1, 2]  # type: ignore[attr-defined]
    assert all(e.how == "cancelled" for e in errors)  # type: ignore[attr-defined]
    assert str(info.value) == "2 replicas failed in MirroredStrategy.run (2 sub-exceptions)"


async def test_a_scope_cancellation_is_told_from_task_cancel() -> None:
    # _ending reads anyio's cancellation message on asyncio: this fails the day it changes.
    seen: list[BaseException] = []

    async def sleeper() -> None:
        try:
            await anyio.sleep_forever()
        except BaseException as exc:
            seen.append(exc)
            raise

    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(sleeper)
            await anyio.lowlevel.checkpoint()
            scope.cancel()
    assert len(seen) == 1
    assert _ending.scope_cancellation(seen[0])
    assert _ending.delivered_by(seen[0], scope, None) in (True, None)
    assert not _ending.scope_cancellation(asyncio.CancelledError())
    assert _ending.delivered_by(asyncio.CancelledError(), scope, None) is False


# -- 2: cancelled while the backend combines ---------------------------------------------


class _CancelInCombine(NumpyBackend):
    """Cancels ``victims`` (scopes) from inside its all_reduce, then takes two turns."""

    victims: list[anyio.CancelScope]

    async def all_reduce(
        self, op: Any, values: Any, *, bytes_per_pack: int = 0
    ) -> list[list[object]]:
        for scope in self.victims:
            scope.cancel()
        await anyio.lowlevel.checkpoint()
        await anyio.lowlevel.checkpoint()
        return await super().all_reduce(op, values, bytes_per_pack=bytes_per_pack)


@pytest.mark.parametrize("options", [None, SLOW], ids=["fast", "slow"])
@pytest.mark.parametrize("last", [True, False], ids=["combining-replica", "waiting-replica"])
async def test_a_replica_cancelled_while_the_backend_combines_fails_the_run(
    options: ar.CommunicationOptions | None, last: bool
) -> None:
    # Before: the replica whose combine was cancelled (it swallowed the cancellation)
    # left its peers parked for ever (a hang); a waiting one that swallowed it returned
    # "cancelled" while its peers got results computed with its value.
    backend = _CancelInCombine(DEVICES)
    backend.victims = []
    arrived: list[int] = []

    async def step() -> object:
        ctx = _ctx()
        rid = ctx.replica_id_in_sync_group
        with anyio.CancelScope() as scope:
            arrived.append(rid)
            if (len(arrived) == 3) == last and not backend.victims:
                backend.victims.append(scope)
            return await ctx.all_reduce("SUM", 1.0, options=options)
        return "cancelled"

    with anyio.fail_after(10), pytest.raises(ar.CollectiveError) as info:
        await strategy(backend=backend).run(step)
    message = str(info.value)
    victim = info.value.report.rows  # type: ignore[union-attr]
    assert [row.state.value for row in victim].count("cancelled") == 1
    if last:
        assert "was cancelled while the backend combined its 1st collective" in message
        assert "the collective can never complete" in message
    else:
        assert "after every replica had arrived there, while the backend combined" in message


@pytest.mark.usefixtures("asyncio_only")
@pytest.mark.parametrize("options", [None, SLOW], ids=["fast", "slow"])
async def test_task_cancel_inside_the_backend_call_wakes_every_waiter(
    options: ar.CommunicationOptions | None,
) -> None:
    tasks: dict[int, asyncio.Task[Any]] = {}

    class Cancelling(NumpyBackend):
        async def all_reduce(
            self, op: Any, values: Any, *, bytes_per_pack: int = 0
        ) -> list[list[object]]:
            current = asyncio.current_task()
            assert current is not None
            current.cancel()  # the replica that dispatches
            await asyncio.sleep(0)
            return await super().all_reduce(op, values, bytes_per_pack=bytes_per_pack)

    helpers: list[asyncio.Future[Any]] = []

    async def step() -> object:
        ctx = _ctx()
        rid = ctx.replica_id_in_sync_group
        task = asyncio.current_task()
        assert task is not None
        tasks[rid] = task
        if rid == 0:
            # A helper outside the run's scope parks too: it must be woken, not left.
            helpers.append(asyncio.ensure_future(ctx.all_reduce("SUM", 1.0, options=options)))
            return await helpers[0]
        return await ctx.all_reduce("SUM", 1.0, options=options)

    with anyio.fail_after(10), pytest.raises(ar.CollectiveError) as info:
        await strategy(backend=Cancelling(DEVICES), check_call_sites=False).run(step)
    assert "was cancelled while the backend combined its 1st collective" in str(info.value)
    assert helpers[0].done()


# -- 3: KeyboardInterrupt / SystemExit in an asyncio helper task ---------------------------


def _loop_factories() -> list[Any]:
    factories: list[Any] = [pytest.param(None, id="asyncio")]
    try:
        import uvloop
    except ImportError:
        return factories
    factories.append(pytest.param(uvloop.new_event_loop, id="uvloop"))
    return factories


@pytest.mark.parametrize("loop_factory", _loop_factories())
@pytest.mark.parametrize("kind", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_in_a_helper_task_carries_the_replica_note(
    kind: type[BaseException], loop_factory: Any
) -> None:
    # Before: asyncio let it leave the loop from the helper task, past the run: no note
    # said which replica, or where.
    async def helper() -> None:
        await asyncio.sleep(0)
        raise kind("stop")

    async def step() -> object:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 1:
            await asyncio.ensure_future(helper())
        return await ctx.all_reduce("SUM", 1.0)

    async def main() -> None:
        await strategy(2).run(step)

    with pytest.raises(kind) as info, asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(main())
    assert info.value.args == ("stop",)
    (note,) = info.value.__notes__
    assert note.startswith(
        "(raised in a task started by replica 1 of 2 in MirroredStrategy.run, at "
        "runtime/test_endings_third_round.py:"
    )
    assert note.endswith(" in helper())")


# -- 4: a trio system task in a copy of a replica's context --------------------------------


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_trio_system_task_in_a_replicas_context_is_refused() -> None:
    # Before: its collective waited past the run's end, whose error, raised in the system
    # task, crashed trio with TrioInternalError.
    import contextvars

    import trio

    seen: list[object] = []

    async def system_task() -> None:
        ctx = ar.get_replica_context()
        seen.append(ctx)
        assert ctx is not None
        await ctx.all_reduce("SUM", 1.0)  # the default context's identity: no run's

    async def step() -> object:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 0:
            trio.lowlevel.spawn_system_task(system_task, context=contextvars.copy_context())
        await trio.lowlevel.checkpoint()
        return await ctx.all_reduce("SUM", 1.0)

    with pytest.raises(ar.ReplicaContextError) as info:
        await strategy(2).run(step)
    message = str(info.value)
    assert message.startswith(
        "Replica 0 started a trio system task (trio.lowlevel.spawn_system_task) in a copy of "
        "its context, at runtime/test_endings_third_round.py:"
    )
    assert "Start the task in a nursery the step function opens" in message
    await trio.lowlevel.checkpoint()
    assert len(seen) == 1
    assert seen[0] is not None
    assert seen[0].num_replicas_in_sync == 1  # type: ignore[attr-defined]


# -- 5: asyncio.wait over collectives awaited out of order -------------------------------


@pytest.mark.usefixtures("asyncio_only")
async def test_asyncio_wait_over_out_of_order_collectives_logs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Before: "Task exception was never retrieved" for each replica's task: the run raised
    # the refusal, and asyncio logged it again from the task that asyncio.wait left.
    async def step() -> object:
        ctx = _ctx()
        a = ctx.all_reduce("SUM", 1.0)
        b = ctx.all_reduce("SUM", 2.0)
        done, _ = await asyncio.wait([asyncio.ensure_future(b), asyncio.ensure_future(a)])
        return [t.result() for t in done]

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        with pytest.raises(ar.CollectiveError) as info:
            await strategy(2).run(step)
        for _ in range(3):
            gc.collect()
            await asyncio.sleep(0)
    assert str(info.value).startswith("Each of replicas 0, 1 awaited all_reduce(SUM)")
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


# -- 6: a refusal every replica gets alike is reported once ----------------------------------


@pytest.mark.usefixtures("asyncio_only")
async def test_a_collective_issued_from_call_soon_on_every_replica_is_reported_once() -> None:
    # Before: "3 replicas failed" with three copies of one refusal.
    async def step() -> object:
        ctx = _ctx()
        loop = asyncio.get_running_loop()
        issued: asyncio.Future[Any] = loop.create_future()

        def callback() -> None:
            try:
                collective = ctx.all_reduce("SUM", 1.0)
            except ar.ReplicaContextError as exc:
                collective = exc
            if not issued.done():  # the run, failed, may have cancelled the step
                issued.set_result(collective)

        loop.call_soon(callback)
        found = await issued
        if isinstance(found, BaseException):
            raise found
        return await found

    with pytest.raises(ar.ReplicaContextError) as info:
        await strategy().run(step)
    message = str(info.value)
    assert message.startswith("Each of replicas 0-2 issued all_reduce(SUM) on float64[] at ")
    assert "outside any task (in a callback the event loop ran" in message
    assert message.count("For more on this error") == 1
