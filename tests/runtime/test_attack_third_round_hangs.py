"""Hangs found by the third round's attack (attack23: B0b, B0d, B0e, B13, B8/B14).

Each test hung (or reported the library's own error as the user's) before its fix; each
runs under a ``fail_after`` guard, so a hang fails it instead of stalling the suite.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest
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


def _results(s: ar.Strategy, result: object) -> list[object]:
    return list(s.experimental_local_results(result))


class _MyBase(BaseException):
    pass


BASE_KINDS = [KeyboardInterrupt, SystemExit, _MyBase]


# -- B0e: a merge_fn's BaseException caught by the steps -----------------------------------


@pytest.mark.parametrize("kind", BASE_KINDS)
async def test_a_merge_fn_interrupt_caught_by_every_step_wakes_every_replica(
    kind: type[BaseException],
) -> None:
    # Before: only the replica that ran merge_fn saw the interrupt; the others waited for
    # ever (99a4116 woke them for an Exception only).
    def merge_fn(strategy: ar.Strategy, value: Any) -> float:
        raise kind("from merge_fn")

    async def step() -> object:
        try:
            return await _ctx().merge_call(merge_fn, args=(1.0,))
        except BaseException as exc:  # save and stop on Ctrl-C
            return type(exc).__name__

    s = strategy()
    with anyio.fail_after(10):
        result = await s.run(step)
    assert set(_results(s, result)) == {kind.__name__}


async def test_a_merge_fn_generator_exit_caught_by_the_steps_fails_the_run() -> None:
    # Before: a hang. GeneratorExit closes the merge_call as a cancellation does: the run
    # fails naming the replica whose merge_fn raised it, the same on every loop.
    def merge_fn(strategy: ar.Strategy, value: Any) -> float:
        raise GeneratorExit

    async def step() -> object:
        try:
            return await _ctx().merge_call(merge_fn, args=(1.0,))
        except BaseException as exc:
            return type(exc).__name__

    with anyio.fail_after(10), pytest.raises(ar.ReplicaCancelledError) as info:
        await strategy().run(step)
    assert info.value.how == "closed"
    assert info.value.where is not None
    assert info.value.where.endswith("in merge_fn()")


# -- B0d: the backend combine raising a BaseException, caught by the steps -----------------


class _RaisingBackend(NumpyBackend):
    kind: type[BaseException] = KeyboardInterrupt

    async def all_reduce(
        self, op: Any, values: Any, *, bytes_per_pack: int = 0
    ) -> list[list[object]]:
        raise self.kind("Ctrl-C in the combine")


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("kind", BASE_KINDS)
async def test_a_backend_interrupt_caught_by_every_step_wakes_every_replica(
    kind: type[BaseException], options: ar.CommunicationOptions | None
) -> None:
    # Before: a hang (even with timeout_seconds): only the dispatching replica saw it.
    backend = _RaisingBackend(DEVICES)
    backend.kind = kind

    async def step() -> object:
        try:
            return await _ctx().all_reduce("SUM", 1.0, options=options)
        except BaseException as exc:
            return type(exc).__name__

    s = strategy(backend=backend)
    with anyio.fail_after(10):
        result = await s.run(step)
    assert set(_results(s, result)) == {kind.__name__}


@pytest.mark.parametrize("options", OPTIONS)
async def test_a_backend_interrupt_caught_by_one_step_still_fails_the_run(
    options: ar.CommunicationOptions | None,
) -> None:
    # Replica 0 catches it, the others do not: the run raises the interrupt, never hangs.
    backend = _RaisingBackend(DEVICES)

    async def step() -> object:
        ctx = _ctx()
        try:
            return await ctx.all_reduce("SUM", 1.0, options=options)
        except KeyboardInterrupt:
            if ctx.replica_id_in_sync_group == 0:
                return -1.0
            raise

    with anyio.fail_after(10), pytest.raises(BaseException) as info:  # noqa: PT011 (a group or not)
        await strategy(backend=backend).run(step)
    leaves = (
        list(info.value.exceptions) if isinstance(info.value, BaseExceptionGroup) else [info.value]
    )
    assert leaves
    assert all(isinstance(e, KeyboardInterrupt) for e in leaves)


# -- B13: an error that refuses attributes, copied for the waiters ------------------------


class _NoSetattr(Exception):
    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"read-only exception: {name}")


@pytest.mark.parametrize("where", ["merge_fn", "backend"])
@pytest.mark.parametrize("caught", [True, False], ids=["caught", "raised"])
async def test_an_error_that_refuses_attributes_reaches_every_waiter(
    where: str, caught: bool
) -> None:
    # Before: the copy for the first waiter raised AttributeError: the others were never
    # woken (a hang, caught), or the library's AttributeError was raised as the user's.
    class Refusing(NumpyBackend):
        async def all_reduce(
            self, op: Any, values: Any, *, bytes_per_pack: int = 0
        ) -> list[list[object]]:
            raise _NoSetattr("x")

    def merge_fn(strategy: ar.Strategy, value: Any) -> float:
        raise _NoSetattr("x")

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
        except _NoSetattr as exc:
            return str(exc)

    s = strategy(backend=Refusing(DEVICES))
    with anyio.fail_after(10):
        if caught:
            assert set(_results(s, await s.run(step))) == {"x"}
        else:
            with pytest.raises(BaseException) as info:  # noqa: PT011 (a group or not)
                await s.run(step)
            leaves = (
                list(info.value.exceptions)
                if isinstance(info.value, BaseExceptionGroup)
                else [info.value]
            )
            assert leaves
            assert all(type(e) is _NoSetattr for e in leaves), leaves


# -- B0b: a collective awaited inside a shielded cancel scope -----------------------------


async def _shielded_sum(options: ar.CommunicationOptions | None) -> object:
    with anyio.CancelScope(shield=True):
        return await _ctx().all_reduce("SUM", 1.0, options=options)


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("peer", ["raises", "returns", "mismatch"])
async def test_a_shielded_waiter_is_woken_when_its_peer_fails(
    peer: str, options: ar.CommunicationOptions | None
) -> None:
    # Before: the run cancelled its replicas; the shield kept the waiter parked for ever.
    async def step() -> object:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 0:
            return await _shielded_sum(options)
        if peer == "raises":
            raise ValueError("peer failed")
        if peer == "mismatch":
            return await ctx.all_reduce("MAX", 1.0, options=options)
        return 0.0

    expected: type[BaseException] = {
        "raises": ValueError,
        "returns": ar.ReplicaExitedError,
        "mismatch": ar.CollectiveMismatchError,
    }[peer]
    with anyio.fail_after(10), pytest.raises(expected):
        await strategy(2, check_call_sites=False).run(step)


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("peer", ["raises", "returns", "mismatch"])
async def test_a_shielded_helper_in_the_replicas_own_task_group_is_woken_when_a_peer_fails(
    peer: str, options: ar.CommunicationOptions | None
) -> None:
    # Before: only the replicas' main tasks were woken; the shielded helper kept its
    # replica's task group, so the replica and the run, waiting for ever.
    told: list[BaseException] = []
    parked = anyio.Event()

    async def helper() -> None:
        try:
            parked.set()  # it arrives before its peer resumes (no checkpoint between)
            await _shielded_sum(options)
        except ar.CollectiveError as exc:
            told.append(exc)
            raise

    async def step() -> object:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 0:
            async with anyio.create_task_group() as tg:
                tg.start_soon(helper)
            return 0.0
        await parked.wait()
        if peer == "raises":
            raise ValueError("peer failed")
        if peer == "mismatch":
            return await ctx.all_reduce("MAX", 1.0, options=options)
        return 0.0

    expected: type[BaseException] = {
        "raises": ValueError,
        "returns": ar.ReplicaExitedError,
        "mismatch": ar.CollectiveMismatchError,
    }[peer]
    with anyio.fail_after(10), pytest.raises(expected):
        await strategy(2, check_call_sites=False).run(step)
    assert len(told) == 1
    assert "can never complete" in str(told[0]) or isinstance(told[0], expected), told[0]


@pytest.mark.parametrize("options", OPTIONS)
async def test_a_shielded_waiter_is_woken_when_the_run_is_cancelled_from_outside(
    options: ar.CommunicationOptions | None,
) -> None:
    # Before: the scope around the run could never end it.
    started = anyio.Event()

    async def step() -> object:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 0:
            started.set()
            return await _shielded_sum(options)
        await anyio.sleep_forever()
        return 0.0

    with anyio.fail_after(10):
        with anyio.CancelScope() as outside:

            async def cancel_when_started() -> None:
                await started.wait()
                await anyio.lowlevel.checkpoint()
                outside.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_when_started)
                await strategy(2).run(step)
        assert outside.cancelled_caught


async def test_a_replica_arriving_under_a_shield_after_the_run_failed_is_told() -> None:
    # A shielded replica that reaches its collective only after its peer failed.
    failed = anyio.Event()

    async def step() -> object:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 0:
            with anyio.CancelScope(shield=True):
                await failed.wait()
                await anyio.lowlevel.checkpoint()
                return await ctx.all_reduce("SUM", 1.0)
        failed.set()
        raise ValueError("peer failed")

    with anyio.fail_after(10), pytest.raises(ValueError, match="peer failed"):
        await strategy(2).run(step)


# -- B8/B14: replicas cancelled while a merge_fn runs ------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_two_replicas_cancelled_in_one_turn_while_merge_fn_runs_are_both_named() -> None:
    # Before: only replica 0 was named, replica 1's row said "running", and the message
    # said its peers "received results" though merge_fn was still running.
    import asyncio

    tasks: dict[int, asyncio.Task[Any]] = {}

    async def merge_fn(strategy: ar.Strategy, value: Any) -> float:
        await asyncio.sleep(0)
        runner = asyncio.current_task()
        for task in tasks.values():
            if task is not runner:
                task.cancel()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return 1.0

    async def step() -> object:
        ctx = _ctx()
        task = asyncio.current_task()
        assert task is not None
        tasks[ctx.replica_id_in_sync_group] = task
        return await ctx.merge_call(merge_fn, args=(1.0,))

    with anyio.fail_after(10), pytest.raises(ar.CollectiveError) as info:
        await strategy().run(step)
    message = str(info.value)
    assert "while their merge_fn ran (replica " in message
    assert "was cancelled there too)" in message
    assert "would receive results" in message
    assert "received results" not in message.replace("would receive results", "")
    rows = info.value.report.rows  # type: ignore[union-attr]
    # The two cancelled replicas (the run cancels the one running merge_fn after them).
    assert [row.state.value for row in rows].count("running") == 0
