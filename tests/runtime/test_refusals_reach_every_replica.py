"""A collective's refusal reaches every replica, whatever catches it: never a hang.

A refusal decidable from the signature (a boolean reduced, IndexedSlices reduced with
MAX) is raised when each replica issues the collective, before any waits. One found
when the last replica dispatches (a leaf reshaped in flight) wakes every parked
replica with its own copy of the error. Before, both kinds reached the dispatching
replica only: a step that caught it returned, and its peers waited forever.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import numpy as np
import pytest

import asyncreplica as ar

pytestmark = pytest.mark.anyio

HANG_GUARD_S = 20  # a hang guard only: a passing run takes milliseconds


def _bool(ctx: ar.ReplicaContext) -> Awaitable[Any]:
    return ctx.all_reduce("sum", np.array([True]))


def _bool_batch(ctx: ar.ReplicaContext) -> Awaitable[Any]:
    return ctx.all_reduce("sum", [np.ones(2), np.array([True, False])])


def _sparse_max(ctx: ar.ReplicaContext) -> Awaitable[Any]:
    return ctx.all_reduce("max", ar.IndexedSlices(np.ones((1, 1)), np.array([0]), (2, 1)))


def _sparse_min_batch(ctx: ar.ReplicaContext) -> Awaitable[Any]:
    sparse = ar.IndexedSlices(np.ones((1, 1)), np.array([0]), (2, 1))
    return ctx.all_reduce("min", {"a": np.ones(1), "b": sparse})


def _reshaped_in_flight(ctx: ar.ReplicaContext) -> Awaitable[Any]:
    buf = np.ones(2)
    pending = ctx.all_reduce("SUM", buf)
    buf.shape = (1, 2)  # found when the last replica dispatches
    return pending


AT_ISSUE: dict[str, tuple[Callable[[ar.ReplicaContext], Awaitable[Any]], type[Exception], str]] = {
    "bool": (_bool, TypeError, "cannot reduce values of dtype bool"),
    "bool_batch": (_bool_batch, TypeError, "cannot reduce values of dtype bool"),
    "sparse_max": (_sparse_max, ValueError, "SUM or MEAN only, not MAX"),
    "sparse_min_batch": (_sparse_min_batch, ValueError, "SUM or MEAN only, not MIN"),
}
REFUSALS = {
    **AT_ISSUE,
    "reshaped_in_flight": (_reshaped_in_flight, ValueError, "changed while its all_reduce"),
}


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("kind", sorted(REFUSALS))
async def test_every_replica_gets_the_refusal_and_a_catching_step_ends(kind: str, n: int) -> None:
    issue, error, message = REFUSALS[kind]
    s = ar.MirroredStrategy([f"CPU:{i}" for i in range(n)])

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        try:
            await issue(ctx)
        except error as exc:
            return (message in str(exc), ctx.replica_id_in_sync_group)
        return "no error"

    with anyio.fail_after(HANG_GUARD_S):
        got = s.experimental_local_results(await s.run(step))
    assert got == tuple((True, r) for r in range(n))
    # The run is usable afterwards: nothing of the refused collective is left behind.
    with anyio.fail_after(HANG_GUARD_S):
        again = await s.run(lambda: ar.get_replica_context().all_reduce("sum", 1.0))  # type: ignore[union-attr]
    assert s.experimental_local_results(again) == (float(n),) * n or again == float(n)


@pytest.mark.parametrize("kind", sorted(AT_ISSUE))
async def test_a_refusal_decidable_from_the_signature_is_raised_at_issue(kind: str) -> None:
    """Raised by ``ctx.all_reduce(...)`` itself, before the replica arrives anywhere."""
    issue, error, message = AT_ISSUE[kind]
    s = ar.MirroredStrategy(["CPU:0", "CPU:1"])

    async def step() -> str:
        ctx = ar.get_replica_context()
        assert ctx is not None
        with pytest.raises(error, match=message):
            issue(ctx)  # not awaited: the call raises
        return "ok"

    with anyio.fail_after(HANG_GUARD_S):
        assert s.experimental_local_results(await s.run(step)) in (("ok", "ok"), ("ok",))


async def test_an_uncaught_dispatch_refusal_fails_the_run_with_it() -> None:
    s = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await _reshaped_in_flight(ctx)

    with anyio.fail_after(HANG_GUARD_S), pytest.raises(ValueError, match="changed while its"):
        await s.run(step)


async def test_a_waiter_that_does_not_catch_fails_the_run_when_the_dispatcher_caught() -> None:
    """The dispatching replica's catch does not hide the error from the others."""
    s = ar.MirroredStrategy(["CPU:0", "CPU:1"])

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        try:
            return await _reshaped_in_flight(ctx)  # replica 0 parks, replica 1 dispatches
        except ValueError:
            if ctx.replica_id_in_sync_group == 0:
                raise
            return "caught"

    with anyio.fail_after(HANG_GUARD_S), pytest.raises(ValueError, match="changed while its"):
        await s.run(step)


@pytest.mark.parametrize("n", [2, 3])
async def test_a_refusal_raised_by_every_replica_is_reported_once(n: int) -> None:
    """Each replica refuses the collective it issues, alike: the run raises that one error,
    not a group of its copies (whose class would depend on how many replicas a process
    holds, and so differ between the processes of a multi-process run)."""
    s = ar.MirroredStrategy([f"CPU:{i}" for i in range(n)])

    async def step() -> object:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.all_reduce("sum", np.array([True]))

    with pytest.raises(TypeError, match="cannot reduce values of dtype bool") as info:
        await s.run(step)
    assert type(info.value) is TypeError
