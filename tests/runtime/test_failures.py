"""Failure semantics: root causes, cancellation, timeouts, reuse after errors."""

from __future__ import annotations

import math
import signal
import threading
from collections.abc import Callable

import anyio
import numpy as np
import pytest
from _clocks import on_autojump_clock, trio_on_autojump_clock

import asyncreplica as ar

pytestmark = pytest.mark.anyio


def strategy(n: int = 3, **kwargs: object) -> ar.MirroredStrategy:
    return ar.MirroredStrategy([f"CPU:{i}" for i in range(n)], **kwargs)  # type: ignore[arg-type]


async def test_exception_is_reraised_as_the_same_object_with_a_note() -> None:
    s = strategy()
    boom = ValueError("boom")
    after: list[int] = []

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        await ctx.all_reduce("sum", 1.0)
        if ctx.replica_id_in_sync_group == 1:
            raise boom
        await ctx.all_reduce("sum", 2.0)
        after.append(ctx.replica_id_in_sync_group)

    with pytest.raises(ValueError, match=r"^boom") as info:
        await s.run(step)
    assert info.value is boom
    assert info.value.__notes__ == ["(raised in replica 1 of 3 in MirroredStrategy.run)"]
    assert after == []  # the others were cancelled at their second collective


async def test_replicas_do_not_start_after_a_failure() -> None:
    s = strategy(4)
    started: list[int] = []

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        started.append(ctx.replica_id_in_sync_group)
        raise KeyError(ctx.replica_id_in_sync_group)

    with pytest.raises(KeyError):
        await s.run(step)
    assert len(started) == 1


async def test_independent_failures_come_as_a_group_in_replica_order() -> None:
    s = strategy(3)
    released = anyio.Event()

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        rid = ctx.replica_id_in_sync_group
        if rid == 0:
            # Replicas 1 and 2 are parked below, shielded from cancellation.
            await anyio.wait_all_tasks_blocked()
            released.set()
            raise ValueError("boom 0")
        with anyio.CancelScope(shield=True):
            await released.wait()
            raise ValueError(f"boom {rid}")

    with pytest.raises(ExceptionGroup) as info:
        await s.run(step)
    assert [str(e) for e in info.value.exceptions] == ["boom 0", "boom 1", "boom 2"]
    assert info.value.exceptions[2].__notes__ == [
        "(raised in replica 2 of 3 in MirroredStrategy.run)"
    ]


async def test_strategy_runs_again_after_every_kind_of_failure() -> None:
    s = strategy(2)

    async def mismatch() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        await ctx.all_reduce("sum", np.zeros(1 + ctx.replica_id_in_sync_group))

    async def exits() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        if ctx.replica_id_in_sync_group:
            await ctx.barrier()

    async def raises() -> None:
        raise RuntimeError("x")

    async def good() -> object:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.all_reduce("sum", float(ctx.replica_id_in_sync_group + 1))

    for bad, error in [
        (mismatch, ar.CollectiveMismatchError),
        (exits, ar.ReplicaExitedError),
        (raises, RuntimeError),
    ]:
        with pytest.raises(error):
            await s.run(bad)
        assert s.experimental_local_results(await s.run(good)) == (3.0, 3.0)


async def test_cancelling_the_run_from_outside_cancels_every_replica() -> None:
    s = strategy(3)
    never = anyio.Event()
    finished: list[int] = []

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        try:
            if ctx.replica_id_in_sync_group == 2:
                await never.wait()
            await ctx.all_reduce("sum", 1.0)
        finally:
            finished.append(ctx.replica_id_in_sync_group)

    before = len(anyio.get_running_tasks())
    async with anyio.create_task_group() as tg:
        tg.start_soon(s.run, step)
        await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    assert sorted(finished) == [0, 1, 2]
    assert len(anyio.get_running_tasks()) == before


@on_autojump_clock
async def test_timeout_names_arrived_and_missing_replicas() -> None:
    s = strategy(3, communication_options=ar.CommunicationOptions(timeout_seconds=30.0))
    never = anyio.Event()

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        if ctx.replica_id_in_sync_group == 1:
            await never.wait()  # alive, but busy elsewhere
        await ctx.all_reduce("sum", 1.0)

    with pytest.raises(ar.CollectiveTimeoutError) as info:
        await s.run(step)
    error = info.value
    assert isinstance(error, TimeoutError)
    assert error.arrived == frozenset({0, 2})
    assert error.missing == frozenset({1})
    assert str(error).startswith(
        "Timed out after 30 s waiting for replica 1 at the 1st collective (position 0)."
    )


@on_autojump_clock
async def test_per_call_timeout_overrides_the_strategy() -> None:
    s = strategy(2, communication_options=ar.CommunicationOptions(timeout_seconds=600.0))
    never = anyio.Event()

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        if ctx.replica_id_in_sync_group == 1:
            await never.wait()
        await ctx.all_reduce("sum", 1.0, ar.CommunicationOptions(timeout_seconds=5.0))

    started = anyio.current_time()
    with pytest.raises(ar.CollectiveTimeoutError, match=r"^Timed out after 5 s "):
        await s.run(step)
    assert anyio.current_time() - started < 600.0  # the call's 5 s, not the strategy's


async def test_merge_fn_exception_fails_the_run() -> None:
    s = strategy(2)

    def merge_fn(strategy: ar.Strategy) -> None:
        raise ZeroDivisionError("in merge_fn")

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        await ctx.merge_call(merge_fn)

    with pytest.raises(ZeroDivisionError, match="in merge_fn") as info:
        await s.run(step)
    assert info.value.__notes__ == [
        (
            "(raised in merge_fn test_merge_fn_exception_fails_the_run.<locals>.merge_fn, called once "
            "for all 2 replicas of MirroredStrategy.run)"
        )
    ]


async def test_results_do_not_depend_on_arrival_order() -> None:
    # Float addition is not associative: (1 + 1e16) - 1e16 == 0, but (-1e16 + 1e16) + 1 == 1.
    values = [1.0, 1e16, -1e16]
    expected = (values[0] + values[1]) + values[2]
    s = strategy(3)
    turn = [anyio.Event() for _ in range(4)]
    turn[3].set()

    async def step() -> object:
        ctx = ar.get_replica_context()
        assert ctx is not None
        rid = ctx.replica_id_in_sync_group
        await turn[rid + 1].wait()  # replica 2 arrives first, then 1, then 0
        turn[rid].set()
        return await ctx.all_reduce("sum", np.float64(values[rid]))

    results = s.experimental_local_results(await s.run(step))
    assert [float(r) for r in results] == [expected] * 3
    assert expected == 0.0
    assert not math.isclose(sum(reversed(values)), expected)


async def test_each_replica_gets_its_own_read_only_view() -> None:
    s = strategy(3)
    x = np.arange(4, dtype=np.float32)

    async def step() -> object:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.all_reduce("sum", x)

    results = s.experimental_local_results(await s.run(step))
    assert len({id(r) for r in results}) == 3
    assert all(np.shares_memory(results[0], r) for r in results)
    assert not any(r.flags.writeable for r in results)
    np.testing.assert_array_equal(x, np.arange(4, dtype=np.float32))
    assert x.flags.writeable


async def test_unnamed_collectives_in_flight_together_raise() -> None:
    s = strategy(2)

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        if ctx.replica_id_in_sync_group == 1:
            # Keep replica 0's first collective pending while it issues the second
            # (otherwise the two need not overlap, whatever the loop's order).
            await anyio.wait_all_tasks_blocked()
        async with anyio.create_task_group() as tg:
            tg.start_soon(ctx.all_reduce, "sum", 1.0)
            tg.start_soon(ctx.all_reduce, "sum", 2.0)

    with pytest.raises(BaseException) as info:  # noqa: PT011 -- one or several replicas
        await s.run(step)

    def leaves(e: BaseException) -> list[BaseException]:
        if isinstance(e, BaseExceptionGroup):
            return [x for sub in e.exceptions for x in leaves(sub)]
        return [e]

    found = leaves(info.value)
    assert found
    # trio may start the second task first: then the first is not awaited yet, and the
    # second is refused for being awaited out of the order the two were issued in.
    assert all(
        isinstance(e, ar.CollectiveError)
        and ("is still in flight" in str(e) or "which it issued earlier" in str(e))
        for e in found
    )
    assert all(f"{__file__.rsplit('/', 2)[-2]}/test_failures.py" in str(e) for e in found)


async def test_collective_from_a_task_outside_the_replica_raises() -> None:
    s = strategy(2)
    holder: list[ar.ReplicaContext] = []

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        holder.append(ctx)

    await s.run(step)
    with pytest.raises(ar.ReplicaContextError, match=r"whose Strategy\.run has finished"):
        await holder[0].all_reduce("sum", 1.0)


async def test_never_awaited_collective_is_reported_with_its_call_site() -> None:
    s = strategy(2)

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        if ctx.replica_id_in_sync_group == 0:
            ctx.all_reduce("sum", 1.0)  # forgot await
        else:
            await ctx.all_reduce("sum", 1.0)

    with pytest.raises(ar.CollectiveError) as info:
        await s.run(step)
    lines = str(info.value).splitlines()
    assert lines[0] == "Replica 0 created 1 collective that it never awaited:"
    assert lines[2].startswith("  * all_reduce(SUM) on float64[] at runtime/test_failures.py:")
    assert "Write `await ctx.all_reduce(...)`" in str(info.value)


@pytest.mark.parametrize(
    "use",
    [
        pytest.param(bool, id="bool"),
        pytest.param(float, id="float"),
        pytest.param(int, id="int"),
        pytest.param(np.asarray, id="numpy"),
        pytest.param(lambda c: c + 1, id="add"),
        pytest.param(lambda c: c > 0, id="compare"),
    ],
)
async def test_a_collective_refuses_to_be_used_as_a_value(use: object) -> None:
    s = strategy(1)

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        pending = ctx.all_reduce("sum", 1.0)
        with pytest.raises(TypeError, match=r"Did you forget `await`\?"):
            use(pending)  # type: ignore[operator]
        await pending

    await s.run(step)


@trio_on_autojump_clock
async def test_cancelling_one_replicas_collective_fails_the_run() -> None:
    s = strategy(2)
    never = anyio.Event()

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        if ctx.replica_id_in_sync_group == 0:
            with anyio.move_on_after(0.01):
                await ctx.all_reduce("sum", 1.0)
            await ctx.all_reduce("sum", 2.0)
        else:
            await never.wait()

    with pytest.raises(
        ar.CollectiveError, match=r"^Replica 0 was cancelled while waiting at its 1st collective"
    ):
        await s.run(step)


async def test_a_helper_task_that_ends_without_its_collective_completes_the_deadlock() -> None:
    s = strategy(2)

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        if ctx.replica_id_in_sync_group == 0:
            async with anyio.create_task_group() as tg:
                tg.start_soon(anyio.lowlevel.checkpoint)  # a helper that issues nothing
                await ctx.all_reduce("sum", 1.0, name="x")
        else:
            await ctx.all_reduce("sum", 1.0, name="y")
            await ctx.all_reduce("sum", 1.0, name="x")

    with pytest.raises(ar.CollectiveDeadlockError) as info:
        await s.run(step)
    assert info.value.cycle == ((0, "x"), (1, "y"))


class _Stop(BaseException):
    """A BaseException of the user's own (not an Exception)."""


@pytest.mark.parametrize("kind", [SystemExit, KeyboardInterrupt, _Stop])
async def test_a_base_exception_in_a_replica_is_raised_itself_with_a_note(
    kind: type[BaseException],
) -> None:
    s = strategy()
    stop = kind("stop")
    after: list[int] = []

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        await ctx.all_reduce("sum", 1.0)
        if ctx.replica_id_in_sync_group == 1:
            raise stop
        await ctx.all_reduce("sum", 2.0)
        after.append(ctx.replica_id_in_sync_group)

    with pytest.raises(kind) as info:
        await s.run(step)
    assert info.value is stop  # not a (nested) BaseExceptionGroup: `except kind` catches it
    assert info.value.__notes__ == ["(raised in replica 1 of 3 in MirroredStrategy.run)"]
    assert after == []  # the others were cancelled at their second collective

    async def good() -> object:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.all_reduce("sum", 1.0)

    assert s.experimental_local_results(await s.run(good)) == (3.0, 3.0, 3.0)


@pytest.mark.parametrize("awaited", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("kind", [SystemExit, KeyboardInterrupt, _Stop])
async def test_a_base_exception_in_a_merge_fn_gets_the_merge_fn_note(
    kind: type[BaseException], awaited: bool
) -> None:
    # The same as an Exception (test_merge_fn_exception_fails_the_run): the error itself,
    # with the note that names the merge_fn, not the replica that happened to call it.
    s = strategy(2)
    stop = kind("stop")

    def merge_fn(strategy: ar.Strategy) -> None:
        raise stop

    async def async_merge_fn(strategy: ar.Strategy) -> None:
        raise stop

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        await ctx.merge_call(async_merge_fn if awaited else merge_fn)

    with pytest.raises(kind) as info:
        await s.run(step)
    assert info.value is stop
    name = "async_merge_fn" if awaited else "merge_fn"
    assert info.value.__notes__ == [
        (
            "(raised in merge_fn test_a_base_exception_in_a_merge_fn_gets_the_merge_fn_note."
            f"<locals>.{name}, called once for all 2 replicas of MirroredStrategy.run)"
        )
    ]


async def test_a_base_exception_beside_an_exception_comes_as_a_group() -> None:
    s = strategy(3)
    released = anyio.Event()
    stop = _Stop("stop")

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        rid = ctx.replica_id_in_sync_group
        if rid == 0:
            await anyio.wait_all_tasks_blocked()
            released.set()
            raise stop
        with anyio.CancelScope(shield=True):
            await released.wait()
            if rid == 2:
                raise ValueError("boom 2")

    with pytest.raises(BaseExceptionGroup) as info:
        await s.run(step)
    assert info.value.exceptions[0] is stop
    assert [type(e) for e in info.value.exceptions] == [_Stop, ValueError]


def test_ctrl_c_under_trio_while_replicas_wait_raises_keyboard_interrupt() -> None:
    trio = pytest.importorskip("trio")
    s = strategy(3)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        await ctx.all_reduce("sum", 1.0)
        if ctx.replica_id_in_sync_group == 1:
            # Ctrl-C while no replica's code runs: trio delivers the KeyboardInterrupt to
            # the task that awaits strategy.run.
            token = trio.lowlevel.current_trio_token()
            token.run_sync_soon(signal.raise_signal, signal.SIGINT)
            await trio.sleep_forever()
        await ctx.all_reduce("sum", 2.0)

    with pytest.raises(KeyboardInterrupt) as info:
        trio.run(s.run, step)
    assert info.value.__notes__ == [
        "(raised while MirroredStrategy.run waited for its 3 replicas, which were cancelled)"
    ]


def _in_threads(*targets: Callable[[], None]) -> list[BaseException]:
    errors: list[BaseException] = []

    def guarded(target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a run hangs"
    return errors


def test_trio_runs_in_two_threads_keep_their_own_task_watch() -> None:
    trio = pytest.importorskip("trio")
    first_started = threading.Event()
    second_started = threading.Event()
    first_done = threading.Event()
    results: dict[str, object] = {}

    def program(name: str, started: threading.Event, wait_for: threading.Event) -> None:
        s = strategy(2)

        async def step() -> object:
            ctx = ar.get_replica_context()
            assert ctx is not None
            started.set()
            # Both runs are active at once; the first one ends first.
            await trio.to_thread.run_sync(wait_for.wait, 30)
            return await ctx.all_reduce("sum", 1.0)

        async def main() -> None:
            results[name] = s.experimental_local_results(await s.run(step))
            if name == "first":
                first_done.set()

        trio.run(main)

    errors = _in_threads(
        lambda: program("first", first_started, second_started),
        lambda: program("second", second_started, first_done),
    )
    assert errors == []
    assert results == {"first": (2.0, 2.0), "second": (2.0, 2.0)}


def test_a_trio_run_in_a_second_thread_sees_its_own_tasks_exit() -> None:
    trio = pytest.importorskip("trio")
    first_started = threading.Event()
    second_done = threading.Event()
    found: list[BaseException] = []

    async def hold() -> None:
        s = strategy(1)

        async def step() -> None:
            first_started.set()
            await trio.to_thread.run_sync(second_done.wait, 30)

        await s.run(step)

    async def deadlocks() -> None:
        # The helper task's exit completes a wait cycle (see the test above); only a
        # task-exit watch in this trio run can notice it.
        s = strategy(2)

        async def step() -> None:
            ctx = ar.get_replica_context()
            assert ctx is not None
            if ctx.replica_id_in_sync_group == 0:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(trio.lowlevel.checkpoint)
                    await ctx.all_reduce("sum", 1.0, name="x")
            else:
                await ctx.all_reduce("sum", 1.0, name="y")
                await ctx.all_reduce("sum", 1.0, name="x")

        try:
            with trio.fail_after(20):  # hang guard
                await s.run(step)
        except ar.CollectiveDeadlockError as exc:
            found.append(exc)
        finally:
            second_done.set()

    def second() -> None:
        first_started.wait(30)
        trio.run(deadlocks)

    errors = _in_threads(lambda: trio.run(hold), second)
    assert errors == []
    assert [type(e) for e in found] == [ar.CollectiveDeadlockError]
