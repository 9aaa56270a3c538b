"""Defects found by attack 23g (the eighth round): each test failed before its fix.

G1: an ndarray resized in place while its all_gather was in flight gave every replica a
    result of a size no signature announced (the in-flight check skipped the gather
    axis, and compared each replica with the last arrival's signature); the batch forms
    of all_gather, broadcast and reduce_scatter were not checked at all (a silently wrong
    gather, a BackendError, an InternalError), where all_reduce refused the same resize.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import numpy as np
import pytest

import asyncreplica as ar

pytestmark = pytest.mark.anyio

DEVICES = ["CPU:0", "CPU:1", "CPU:2"]


def strategy(n: int = 2, **kwargs: Any) -> ar.MirroredStrategy:
    return ar.MirroredStrategy(DEVICES[:n], **kwargs)


def _ctx() -> ar.ReplicaContext:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return ctx


def _rid() -> int:
    return int(_ctx().replica_id_in_sync_group)


def _leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


# -- G1: a value resized in flight is refused by every collective, on one rule ----------------

Issue = Callable[[ar.ReplicaContext, np.ndarray], Awaitable[Any]]

ISSUES: dict[str, Issue] = {
    "all_gather": lambda ctx, x: ctx.all_gather(x, 0),
    "all_gather batch": lambda ctx, x: ctx.all_gather([x, np.ones((2, 3))], 0),
    "all_reduce": lambda ctx, x: ctx.all_reduce("sum", x),
    "all_reduce batch": lambda ctx, x: ctx.all_reduce("sum", [x, np.ones(3)]),
    "broadcast": lambda ctx, x: ctx.broadcast(x, 0),
    "broadcast batch": lambda ctx, x: ctx.broadcast([x, np.ones(3)], 0),
    "reduce_scatter": lambda ctx, x: ctx.reduce_scatter("sum", x),
    "reduce_scatter batch": lambda ctx, x: ctx.reduce_scatter("sum", [x, np.ones(4)]),
}


@pytest.mark.parametrize("arrives", ["first", "last"])
@pytest.mark.parametrize("kind", list(ISSUES))
async def test_a_value_resized_in_flight_is_refused_by_every_collective(
    kind: str, arrives: str
) -> None:
    issue = ISSUES[kind]
    peer_arrived = anyio.Event()

    async def step() -> Any:
        ctx = _ctx()
        r = _rid()
        x = np.full(4, float(r + 1))
        pending = issue(ctx, x)
        if r == 1:
            peer_arrived.set()  # replica 1 awaits (arrives) before replica 0 runs again
            return await pending
        if arrives == "last":
            await peer_arrived.wait()
        x.resize((6,), refcheck=False)  # in place, after the issue, before the arrival
        x[:] = 9.0
        return await pending

    with pytest.raises(ValueError, match=r"replica 0's (value|batch) changed while its ") as info:
        await strategy().run(step)
    error = _leaf(info.value)
    assert isinstance(error, ValueError)
    text = str(error)
    assert "was in flight" in text
    assert "leaf 0 was float64[4] when the collective was issued and is float64[6] now" in text


async def test_an_uneven_all_gather_is_held_to_each_replicas_own_size() -> None:
    # Replica 1 issues 2 rows and grows to replica 0's 4 in flight: the last arrival's
    # signature (4 rows) would pass it; its own (2 rows) does not.
    async def step() -> Any:
        ctx = _ctx()
        r = _rid()
        x = np.full(4 if r == 0 else 2, float(r + 1))
        pending = ctx.all_gather(x, 0)
        if r == 1:
            x.resize((4,), refcheck=False)
        return await pending

    with pytest.raises(ValueError, match=r"replica 1's value changed while its all_gather"):
        await strategy().run(step)


async def test_an_uneven_all_gather_left_alone_is_not_refused() -> None:
    async def step() -> Any:
        r = _rid()
        return await _ctx().all_gather([np.full((3 - r, 2), float(r)), np.full(r + 1, float(r))], 0)

    result = await strategy(3).run(step)
    for rows, flat in strategy(3).experimental_local_results(result):
        np.testing.assert_array_equal(rows[:, 0], [0, 0, 0, 1, 1, 2])
        np.testing.assert_array_equal(flat, [0, 1, 1, 2, 2, 2])
