"""Hangs found by the fourth round's attack (attack23b: C11, C9, C7).

Each test hung before its fix; each runs under a ``fail_after`` guard, so a hang fails it
instead of stalling the suite.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest
from _clocks import trio_on_autojump_clock
from asyncreplica_numpy import NumpyBackend

import asyncreplica as ar

pytestmark = pytest.mark.anyio

DEVICES = ["CPU:0", "CPU:1", "CPU:2"]
SLOW = ar.CommunicationOptions(timeout_seconds=60)  # a timeout: the slow path
OPTIONS = [pytest.param(None, id="fast"), pytest.param(SLOW, id="slow")]


def strategy(n: int = 3, **kwargs: Any) -> ar.MirroredStrategy:
    return ar.MirroredStrategy(DEVICES[:n], **kwargs)


def _ctx() -> ar.ReplicaContext:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return ctx


# -- C11: merge_fn awaits a collective its replica issued before merge_call ----------------


@pytest.mark.parametrize("options", OPTIONS)
async def test_a_merge_fn_awaiting_a_collective_issued_before_merge_call_is_refused(
    options: ar.CommunicationOptions | None,
) -> None:
    # Before: a hang (merge_fn waits for replicas 1, 2 at "pre"; they wait for merge_fn);
    # with a timeout, "Replica 0 was cancelled while waiting at 'pre'", which was false.
    async def step() -> object:
        ctx = _ctx()
        pre = ctx.all_reduce("SUM", 1.0, name="pre", options=options)
        if ctx.replica_id_in_sync_group == 0:
            for _ in range(5):  # replica 0 arrives last: merge_fn runs in its task
                await anyio.lowlevel.checkpoint()

        async def merge_fn(strategy: ar.Strategy) -> object:
            return await pre

        result = await ctx.merge_call(merge_fn)
        return result, await pre

    s = strategy()
    with anyio.fail_after(10), pytest.raises(ar.ReplicaContextError) as info:
        await s.run(step)
    message = str(info.value)
    assert "A merge_fn awaited a collective that replica 0 issued before merge_call" in message
    assert "name='pre'" in message
    assert "test_attack_fourth_round_hangs.py:" in message  # where it was issued
    assert "Await the collective in the step function" in message


async def test_a_merge_fn_awaiting_it_through_a_helper_task_is_refused_too() -> None:
    # Held (a pin, not a before/after test): the same cycle through a task merge_fn starts
    # (a task group) is refused as a task not of the replica, never a hang.
    async def step() -> object:
        ctx = _ctx()
        pre = ctx.all_reduce("SUM", 1.0, name="pre")
        if ctx.replica_id_in_sync_group == 0:
            for _ in range(5):
                await anyio.lowlevel.checkpoint()

        async def merge_fn(strategy: ar.Strategy) -> None:
            async def helper() -> None:
                await pre

            async with anyio.create_task_group() as tg:
                tg.start_soon(helper)

        await ctx.merge_call(merge_fn)
        return await pre

    s = strategy()
    with anyio.fail_after(10), pytest.raises(ar.ReplicaContextError) as info:
        await s.run(step)
    assert "replica 0" in str(info.value)
    assert "name='pre'" in str(info.value)


# -- C9: timeout_seconds bounds an async backend's combine, as it bounds merge_fn -----------


class _Stuck(NumpyBackend):
    """A third-party backend whose combine waits for ever (a peer, a device)."""

    async def all_reduce(self, op: Any, values: Any, *, bytes_per_pack: int = 0) -> Any:
        await anyio.sleep_forever()


@trio_on_autojump_clock
@pytest.mark.parametrize("caught", [False, True], ids=["raised", "caught"])
async def test_a_backend_combine_that_never_returns_times_out(caught: bool) -> None:
    # Before: a hang; timeout_seconds bounded the rendezvous and merge_fn, not the combine.
    async def step() -> object:
        try:
            return await _ctx().all_reduce("SUM", 1.0)
        except ar.CollectiveTimeoutError as exc:
            if not caught:
                raise
            return type(exc).__name__

    s = strategy(
        backend=_Stuck(DEVICES), communication_options=ar.CommunicationOptions(timeout_seconds=0.2)
    )
    with anyio.fail_after(10), pytest.raises(ar.CollectiveTimeoutError) as info:
        await s.run(step)
    message = str(info.value)
    assert message.startswith(
        "Timed out after 0.2 s waiting for the 'numpy' backend's all_reduce "
        "(_Stuck.all_reduce) to return at the 1st collective"
    ), message
    assert "test_attack_fourth_round_hangs.py:" in message  # where the combine waits
    assert "replicas 0-2 arrived" in message


# -- C7: an error whose copy raises a BaseException -----------------------------------------


class _CopyInterrupted(Exception):
    """An error whose copy is interrupted (as a Ctrl-C landing in ``copy.copy`` would)."""

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise KeyboardInterrupt("copy of the error interrupted")


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("where", ["merge_fn", "backend"])
@pytest.mark.parametrize("caught", [True, False], ids=["caught", "raised"])
async def test_an_error_whose_copy_is_interrupted_reaches_every_waiter(
    options: ar.CommunicationOptions | None, where: str, caught: bool
) -> None:
    # Before: caught, a hang on asyncio and uvloop (the copy for the first waiter raised,
    # the others were never woken); raised, the KeyboardInterrupt of the library's copy
    # was told as "raised in replica 2", and the user's error was lost.
    class Failing(NumpyBackend):
        async def all_reduce(self, op: Any, values: Any, *, bytes_per_pack: int = 0) -> Any:
            raise _CopyInterrupted("boom")

    def merge_fn(strategy: ar.Strategy, value: Any) -> float:
        raise _CopyInterrupted("boom")

    async def collective() -> object:
        ctx = _ctx()
        if where == "merge_fn":
            return await ctx.merge_call(merge_fn, args=(1.0,))
        return await ctx.all_reduce("SUM", 1.0)

    async def step() -> object:
        if not caught:
            return await collective()
        try:
            return await collective()
        except BaseException as exc:
            return type(exc).__name__

    s = strategy(backend=Failing(DEVICES), communication_options=options)
    with anyio.fail_after(10):
        if caught:
            assert set(s.experimental_local_results(await s.run(step))) == {"_CopyInterrupted"}
        else:
            with pytest.raises(_CopyInterrupted, match="boom"):
                await s.run(step)
