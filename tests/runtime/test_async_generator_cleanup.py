"""A collective in an async generator's ``finally``, closed by the event loop (attack 23g, 4).

Every replica breaks out of ``async for`` over a generator whose ``finally`` awaits a
collective. trio closes the generator in its own system task and only logs what
escapes it, so the refusal there was printed as "Exception ignored" and the run
returned normally: the flush ran on no replica. Now the run fails with the refusal, as
on asyncio (where the generator is closed in a task the run did not see created).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

import asyncreplica as ar

pytestmark = [
    pytest.mark.anyio,
    # trio logs the refusal it could not deliver ("Exception ignored during finalization")
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


async def metrics(ctx: ar.ReplicaContext, flushed: list[int]) -> AsyncIterator[float]:
    try:
        for i in range(3):
            yield float(await ctx.all_reduce("sum", float(i)))
    finally:
        await ctx.all_reduce("sum", 100.0)  # a flush every replica must run
        flushed.append(ctx.replica_id_in_sync_group)


async def test_a_collective_in_a_generator_closed_by_the_loop_fails_the_run(
    anyio_backend_name: str,
) -> None:
    flushed: list[int] = []

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        async for _ in metrics(ctx, flushed):
            break
        return await ctx.all_reduce("sum", 7.0)

    s = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    with pytest.raises((ar.ReplicaContextError, ar.CollectiveError)) as caught:
        await s.run(step)
    if anyio_backend_name == "trio":
        assert type(caught.value) is ar.ReplicaContextError
        assert "trio closing an async generator left unfinished" in str(caught.value)
    assert flushed == []


async def test_aclosing_runs_the_generators_collective_in_the_replica() -> None:
    flushed: list[int] = []

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        async with contextlib.aclosing(metrics(ctx, flushed)) as values:
            async for _ in values:
                break
        return await ctx.all_reduce("sum", 7.0)

    s = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    result = await s.run(step)
    assert [float(v) for v in s.experimental_local_results(result)] == [14.0, 14.0]
    assert sorted(flushed) == [0, 1]
