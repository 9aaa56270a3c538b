"""Replica endings found by an attack on the lifecycle promise (issue 23, second round).

Each test is one way a run that should fail with a named, accurate error did something
else: lost the user's exception, dropped a failure, returned values that disagree, warned,
or told a wrong story in its message or report.
"""

from __future__ import annotations

import asyncio
import gc
import warnings
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import asyncreplica as ar
from asyncreplica._core._ledger import ReplicaState

pytestmark = pytest.mark.anyio


def strategy(n: int = 2, **kwargs: Any) -> ar.MirroredStrategy:
    return ar.MirroredStrategy([f"CPU:{i}" for i in range(n)], **kwargs)


def _ctx() -> ar.ReplicaContext:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return ctx


def _rid() -> int:
    return _ctx().replica_id_in_sync_group


@pytest.fixture
def asyncio_only(anyio_backend: object) -> None:
    if anyio_backend == "trio":
        pytest.skip("asyncio tasks and futures")


# -- F1: a user's exception whose __str__ raises ----------------------------------------


class BadStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ is broken")


@pytest.mark.usefixtures("asyncio_only")
async def test_exception_whose_str_raises_is_reraised_and_the_run_is_torn_down() -> None:
    # Before: the run raised the RuntimeError of BadStr.__str__ from its teardown; the
    # helper's collective was never aborted (it hung) and the task factory stayed.
    helper: list[asyncio.Future[Any]] = []
    loop = asyncio.get_running_loop()
    factory = loop.get_task_factory()

    async def step() -> object:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 0:
            helper.append(asyncio.ensure_future(ctx.all_reduce("SUM", 1.0, name="x")))
            await anyio.sleep_forever()
        await asyncio.sleep(0)  # the helper parks at "x"
        raise BadStr

    with pytest.raises(BadStr) as info:
        await strategy().run(step)
    assert info.value.__notes__ == ["(raised in replica 1 of 2 in MirroredStrategy.run)"]
    assert loop.get_task_factory() is factory
    with anyio.fail_after(5), pytest.raises(ar.CollectiveError) as ended:
        await helper[0]
    assert "BadStr (its message could not be read: its __str__ raised)" in str(ended.value)


# -- F2: a scope around run cancelled while the run fails --------------------------------


async def test_failure_survives_a_cancelled_scope_around_run() -> None:
    # Before: the cancellation of the scope was re-raised and the ValueError dropped; the
    # scope swallowed its cancellation and the code went on as if the run timed out.
    outer = anyio.CancelScope()

    async def step() -> object:
        if _rid() == 0:
            await anyio.lowlevel.checkpoint()  # replica 1 parks
            raise ValueError("the real failure")
        try:
            return await _ctx().all_reduce("SUM", 1.0)
        finally:
            outer.cancel()  # while the run is failing

    with pytest.raises(ValueError, match=r"^the real failure") as info, outer:
        await strategy().run(step)
    assert info.value.__notes__ == ["(raised in replica 0 of 2 in MirroredStrategy.run)"]


# -- F3: cancelled after the collective completed ----------------------------------------


@pytest.mark.usefixtures("asyncio_only")
async def test_helper_cancelled_after_its_collective_completed_fails_the_run() -> None:
    # Before: replica 0's helper saw CancelledError after the collective completed with
    # its value; the run returned {0: "cancelled", 1: 3.0}.
    helpers: list[asyncio.Future[Any]] = []

    async def step() -> object:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 0:
            helpers.append(asyncio.ensure_future(ctx.all_reduce("SUM", 1.0, name="h")))
            try:
                return await helpers[0]
            except asyncio.CancelledError:
                return "cancelled"
        await asyncio.sleep(0)  # replica 0's helper parks at "h"
        result = await ctx.all_reduce("SUM", 2.0, name="h")  # completes it
        helpers[0].cancel()  # before the helper resumes with its result
        return result

    with pytest.raises(ar.CollectiveError) as info:
        await strategy().run(step)
    assert str(info.value).startswith(
        "Replica 0 was cancelled while waiting at its collective named 'h' (1st use), "
        "after that collective had completed: its peers received results computed with "
        "its value, and it never took its own"
    )


async def _cancel_after_completion(seed: int) -> str:
    """One run where replica 0 cancels replica 1's scope around their 2nd collective."""
    scopes: dict[int, anyio.CancelScope] = {}

    async def step() -> object:
        ctx = _ctx()
        rid = ctx.replica_id_in_sync_group
        x = await ctx.all_reduce("SUM", 1.0)
        with anyio.CancelScope() as scope:
            scopes[rid] = scope
            x = await ctx.all_reduce("SUM", x)
            if rid == 0 and 1 in scopes:
                scopes[1].cancel()
        return float(x)

    try:
        result = await strategy(3, schedule="random", seed=seed).run(step)
    except ar.CollectiveError as error:
        return str(error).splitlines()[0]
    return repr(sorted(set(result.values)))


async def test_cancelled_after_a_collective_completed_never_returns_values_that_disagree() -> None:
    # Before (schedule="random", where a replica yields after its collective completed):
    # replica 1's own scope caught the cancellation there and it returned its old value.
    outcomes = {await _cancel_after_completion(seed) for seed in range(12)}
    failed = "Replica 1 was cancelled while waiting at its 2nd collective (position 1)"
    assert outcomes <= {
        "[9.0]",
        f"{failed}; replica 2 waits there: the collective can never complete.",
        f"{failed}, after that collective had completed: its peers received results computed with its value, and it never took its own, so the replicas would go on with values that disagree.",
    }, outcomes
    assert any(o.startswith(failed) for o in outcomes)  # it did land after completion


# -- F4: a replica's task cancelled before it started ------------------------------------


@pytest.mark.usefixtures("asyncio_only")
async def test_replica_cancelled_before_it_started_leaves_no_unawaited_coroutine() -> None:
    # Before: "coroutine 'Run._replica_main' was never awaited" (RuntimeWarning).
    async def step() -> object:
        return await _ctx().all_reduce("SUM", 1.0)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = asyncio.ensure_future(strategy().run(step))
        await asyncio.sleep(0)  # the run has created its replicas' tasks
        for task in asyncio.all_tasks():
            if task.get_name() == "asyncreplica replica 1":
                task.cancel()  # before its first step
        with pytest.raises(ar.ReplicaCancelledError) as info:
            await run
        del run
        gc.collect()
    assert info.value.replica_id == 1
    assert info.value.where is None
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []


# -- F5: a plain step function whose awaitable was cancelled -----------------------------


@pytest.mark.usefixtures("asyncio_only")
async def test_cancelled_awaitable_of_a_plain_step_is_told_truthfully() -> None:
    # Before: "... before it ran any of its step function", though it had run it.
    loop = asyncio.get_running_loop()

    def step() -> asyncio.Future[int]:
        future = loop.create_future()
        if _rid() == 1:
            future.cancel()
        else:
            future.set_result(1)
        return future

    with pytest.raises(ar.ReplicaCancelledError) as info:
        await strategy().run(step)
    assert info.value.where is None
    assert str(info.value).splitlines()[0] == (
        "Replica 1 of 2 was cancelled from outside its MirroredStrategy.run while it awaited "
        "what its step function returned (no line of it was running)."
    )


# -- F6: a user's group holding a CancelledError ---------------------------------------


async def test_group_of_cancellations_is_a_replica_cancelled_on_every_loop() -> None:
    # Before (trio): the group itself was re-raised, unlike asyncio.
    async def step() -> object:
        if _rid() == 1:
            raise BaseExceptionGroup("g", [asyncio.CancelledError()])
        return 0

    with pytest.raises(ar.ReplicaCancelledError) as info:
        await strategy().run(step)
    assert info.value.replica_id == 1


async def test_group_of_a_failure_and_a_cancellation_raises_the_failure_on_every_loop() -> None:
    # Before (trio): the group with its CancelledError was re-raised, unlike asyncio.
    failure = ValueError(1)

    async def step() -> object:
        if _rid() == 1:
            raise BaseExceptionGroup("g", [failure, asyncio.CancelledError()])
        return 0

    with pytest.raises(ExceptionGroup) as info:
        await strategy().run(step)
    assert info.value.message == "g"
    assert list(info.value.exceptions) == [failure]


# -- F7: the story of replicas cancelled while waiting -----------------------------------


async def test_replica_cancelled_while_waiting_is_shown_cancelled_where_it_waited() -> None:
    # Before: "replica 1 wait there"; replica 2 shown "running, position 1".
    scopes: dict[int, anyio.CancelScope] = {}

    async def step() -> object:
        ctx = _ctx()
        rid = ctx.replica_id_in_sync_group
        if rid == 0:
            await anyio.lowlevel.checkpoint()  # replicas 1 and 2 park
            scopes[2].cancel()
            await anyio.sleep_forever()
        with anyio.CancelScope() as scope:
            scopes[rid] = scope
            return await ctx.all_reduce("SUM", 1.0)
        return "gave up"

    with pytest.raises(ar.CollectiveError) as info:
        await strategy(3).run(step)
    assert str(info.value).splitlines()[0] == (
        "Replica 2 was cancelled while waiting at its 1st collective (position 0); "
        "replica 1 waits there: the collective can never complete."
    )
    report = info.value.report
    assert report is not None
    assert [(row.state, row.position) for row in report.rows] == [
        (ReplicaState.RUNNING, 0),
        (ReplicaState.WAITING, 0),
        (ReplicaState.CANCELLED, 0),
    ]


@pytest.mark.usefixtures("asyncio_only")
async def test_two_replicas_cancelled_in_one_turn_are_both_shown_cancelled() -> None:
    # Before: the second one cancelled was still described and listed as waiting.
    tasks: dict[int, asyncio.Task[Any]] = {}

    async def step() -> object:
        ctx = _ctx()
        rid = ctx.replica_id_in_sync_group
        task = asyncio.current_task()
        assert task is not None
        tasks[rid] = task
        if rid == 0:
            await asyncio.sleep(0)  # replicas 1 and 2 park
            tasks[2].cancel()
            tasks[1].cancel()
            await anyio.sleep_forever()
        return await ctx.all_reduce("SUM", 1.0)

    with pytest.raises(ar.CollectiveError) as info:
        await strategy(3).run(step)
    assert str(info.value).splitlines()[0] == (
        "Replica 2 was cancelled while waiting at its 1st collective (position 0); "
        "replica 1 was cancelled there too: the collective can never complete."
    )
    report = info.value.report
    assert report is not None
    assert [(row.state, row.position) for row in report.rows] == [
        (ReplicaState.RUNNING, 0),
        (ReplicaState.CANCELLED, 0),
        (ReplicaState.CANCELLED, 0),
    ]


# -- F8: a user's exception that refuses a note ------------------------------------------


class NoSetattr(Exception):
    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"read-only: {name}")


@pytest.mark.parametrize("make", ["tuple notes", "no setattr"])
async def test_exception_that_refuses_a_note_is_reraised_as_itself(make: str) -> None:
    # Before: the library's TypeError (or AttributeError) from add_note replaced it.
    if make == "tuple notes":
        error: Exception = ValueError("the user's error")
        error.__notes__ = ("a note",)  # type: ignore[assignment]
    else:
        error = NoSetattr("the user's error")

    async def step() -> object:
        if _rid() == 1:
            raise error
        return 0

    with pytest.raises(type(error)) as info:
        await strategy().run(step)
    assert info.value is error


@pytest.mark.usefixtures("asyncio_only")
@pytest.mark.parametrize("run_first", [True, False])
async def test_shutdown_cancelling_the_run_and_its_replicas_cancels_the_run(
    run_first: bool,
) -> None:
    # A shutdown that cancels every task cancels the run's task and its replicas' apart:
    # the run is cancelled; its replicas' cancellations are not failures of it (the fix
    # of a failure under a cancelled scope must not turn them into ReplicaCancelledError).
    async def step() -> object:
        if _rid() == 0:
            await anyio.sleep_forever()
        return await _ctx().all_reduce("SUM", 1.0)

    run = asyncio.ensure_future(strategy().run(step))
    for _ in range(3):
        await asyncio.sleep(0)  # replica 1 parks, replica 0 sleeps
    replicas = [t for t in asyncio.all_tasks() if t.get_name().startswith("asyncreplica replica")]
    assert len(replicas) == 2
    for task in [run, *replicas] if run_first else [*replicas, run]:
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run


@pytest.mark.usefixtures("asyncio_only")
async def test_replica_task_cancelled_after_its_collective_completed_fails_the_run() -> None:
    # Before: replica 1, parked on the fast path, resumed with CancelledError after the
    # collective completed; it caught it and the run returned {0: 3.0, 1: "cancelled"}.
    tasks: dict[int, asyncio.Task[Any]] = {}

    async def step() -> object:
        ctx = _ctx()
        rid = ctx.replica_id_in_sync_group
        task = asyncio.current_task()
        assert task is not None
        tasks[rid] = task
        if rid == 0:
            await asyncio.sleep(0)  # replica 1 parks
        try:
            x = float(await ctx.all_reduce("SUM", 1.0 + rid))
        except asyncio.CancelledError:
            return "cancelled"
        if rid == 0:
            tasks[1].cancel()  # completed, but replica 1 has not resumed yet
        return x

    with pytest.raises(ar.CollectiveError) as info:
        await strategy().run(step)
    assert str(info.value).startswith(
        "Replica 1 was cancelled while waiting at its 1st collective (position 0), after "
        "that collective had completed"
    )


async def test_replica_returning_after_the_run_failed_is_not_a_second_failure() -> None:
    # Before: replica 1 caught its cancellation and returned after a mismatch; the
    # deadlock check at its end crashed (IndexError in the ledger), and that library
    # error came out with a note blaming the replicas, in a group with the mismatch.
    async def step() -> object:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 0:
            await anyio.lowlevel.checkpoint()  # replica 1 parks
            return await ctx.all_reduce("SUM", 1.0)
        try:
            return await ctx.all_reduce("SUM", 1.0)  # another call site: a mismatch
        except anyio.get_cancelled_exc_class():
            return "gave up"

    with pytest.raises(ar.CollectiveMismatchError):
        await strategy().run(step)
