"""Misleading endings found by the fourth round's attack (attack23b: C13, C10).

Each test told the wrong story (a replica blamed, a previous run's story, no note) before
its fix.
"""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
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


# -- C13: the backend's combine ends with GeneratorExit or a CancelledError ------------------


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("kind", [GeneratorExit, asyncio.CancelledError])
@pytest.mark.parametrize("caught", [True, False], ids=["caught", "raised"])
async def test_a_backend_ending_like_a_cancellation_is_told_as_the_backends(
    options: ar.CommunicationOptions | None, kind: type[BaseException], caught: bool
) -> None:
    # Before: "Replica 2 was cancelled while the backend combined its 1st collective":
    # nothing cancelled any replica, the backend (or a library it calls) raised.
    class Ending(NumpyBackend):
        async def all_reduce(self, op: Any, values: Any, *, bytes_per_pack: int = 0) -> Any:
            raise kind("from the backend")

    async def step() -> object:
        try:
            return await _ctx().all_reduce("SUM", 1.0, options=options)
        except ar.BackendError as exc:
            if not caught:
                raise
            return type(exc.__cause__).__name__

    s = strategy(backend=Ending(DEVICES))
    with anyio.fail_after(10):
        if caught:
            assert set(s.experimental_local_results(await s.run(step))) == {kind.__name__}
            return
        with pytest.raises(ar.BackendError) as info:
            await s.run(step)
    message = str(info.value)
    assert message.startswith(
        f"The backend's combine ended with {kind.__name__}('from the backend') though nothing "
        "cancelled it, in the 'numpy' backend's all_reduce (Ending.all_reduce)"
    ), message
    assert "was cancelled" not in message
    assert isinstance(info.value.__cause__, kind)
    assert not any("raised in replica" in n for n in getattr(info.value, "__notes__", []))


# -- C10: a step raising asyncreplica's own error classes ----------------------------------


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: ar.CollectiveError("user-made collective error"), id="collective"),
        pytest.param(lambda: ar.InternalError("user-made internal error"), id="internal"),
    ],
)
async def test_a_library_error_made_by_the_step_is_noted_as_the_replicas(make: Any) -> None:
    # Before: raised with no replica note, as if the run had made it (an InternalError
    # from the user's code read as asyncreplica's own bug report).
    async def step() -> object:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 1:
            raise make()
        return await ctx.all_reduce("SUM", 1.0)

    s = strategy(2)
    with anyio.fail_after(10), pytest.raises(ar.AsyncReplicaError, match="user-made") as info:
        await s.run(step)
    assert "(raised in replica 1 of 2 in MirroredStrategy.run)" in info.value.__notes__


async def test_an_earlier_runs_error_raised_again_is_noted_as_the_replicas() -> None:
    # Before: the second run raised the first run's ReplicaExitedError as its own story
    # ("replica 1 is waiting"), false for this run: replica 1 raised it, replica 0 waited.
    async def uneven() -> object:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 0:
            return 0.0
        return await ctx.all_reduce("SUM", 1.0)

    s = strategy(2)
    with anyio.fail_after(10), pytest.raises(ar.ReplicaExitedError) as first:
        await s.run(uneven)
    assert not any("raised in replica" in n for n in getattr(first.value, "__notes__", []))
    saved = first.value

    async def step() -> object:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 1:
            raise saved
        return await ctx.all_reduce("SUM", 1.0)

    with anyio.fail_after(10), pytest.raises(ar.ReplicaExitedError) as info:
        await s.run(step)
    assert info.value is saved
    assert (
        "(raised in replica 1 of 2 in MirroredStrategy.run: an earlier run made this error, "
        "and the step raised it again)" in info.value.__notes__
    )


async def test_the_runs_own_errors_still_carry_no_replica_note() -> None:
    # The rule above keeps the run's own errors as they were: they name their replicas.
    async def step() -> object:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 0:
            return await ctx.all_reduce("SUM", 1.0)
        return await ctx.all_reduce("MAX", 1.0)

    s = strategy(2)
    with anyio.fail_after(10), pytest.raises(ar.CollectiveMismatchError) as info:
        await s.run(step)
    assert not any("raised in replica" in n for n in getattr(info.value, "__notes__", []))
