"""Silent results found by the fourth attack (issue 23, attack23b): each failed before its fix.

C14: extended.update in replica context ran replica 0's fn for every replica.
"""

from __future__ import annotations

from typing import Any

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


# -- C14: what the replicas pass to extended.update must agree ------------------------------


def _sub(x: float, d: float) -> float:
    return x - d


def _add(x: float, d: float) -> float:
    return x + d


async def test_update_with_a_different_fn_per_replica_is_a_mismatch() -> None:
    w = ar.Mirrored([1.0, 1.0])

    async def step() -> Any:
        ctx = _ctx()
        fn = _sub if ctx.replica_id_in_sync_group == 0 else _add
        return await ctx.strategy.extended.update(w, fn, args=(0.5,))

    with pytest.raises(ar.CollectiveMismatchError) as info:
        await strategy().run(step)
    message = str(info.value)
    assert info.value.fields == ("merge_fn",)
    assert "replica 0 called merge_call(extended.update(_sub)) at " in message
    assert "replica 1 called merge_call(extended.update(_add)) at " in message
    assert "test_attack_fourth_round_silent.py:" in message


async def test_update_with_a_different_lambda_per_replica_is_a_mismatch() -> None:
    w = ar.Mirrored([1.0, 1.0])

    async def step() -> Any:
        ctx = _ctx()
        first = ctx.replica_id_in_sync_group == 0
        fn = (lambda x, d: x - d) if first else (lambda x, d: x + d)
        return await ctx.strategy.extended.update(w, fn, args=(0.5,))

    with pytest.raises(ar.CollectiveMismatchError, match="merge_fn differs"):
        await strategy(check_call_sites=False).run(step)


async def test_update_with_a_different_group_per_replica_is_a_mismatch() -> None:
    w = ar.Mirrored([1.0, 1.0])

    async def step() -> Any:
        ctx = _ctx()
        group = ctx.replica_id_in_sync_group == 0
        return await ctx.strategy.extended.update(w, _sub, args=(0.5,), group=group)

    with pytest.raises(ar.CollectiveMismatchError, match=r"extended.update\(_sub, group=False\)"):
        await strategy().run(step)


async def test_update_and_a_merge_call_of_the_same_fn_do_not_pair() -> None:
    def merge(strategy: Any, *args: Any) -> str:
        return "merged"

    w = ar.Mirrored([1.0, 1.0])

    async def step() -> Any:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 0:
            return await ctx.merge_call(merge, args=(w,))
        return await ctx.strategy.extended.update(w, merge)

    with pytest.raises(ar.CollectiveMismatchError, match="merge_fn differs"):
        await strategy(check_call_sites=False).run(step)


async def test_update_with_a_different_var_per_replica_is_refused_by_name() -> None:
    w = ar.Mirrored([1.0, 1.0])
    other = ar.Mirrored([100.0, 100.0])

    async def step() -> Any:
        ctx = _ctx()
        mine = w if ctx.replica_id_in_sync_group != 1 else other
        return await ctx.strategy.extended.update(mine, _sub, args=(0.5,))

    with pytest.raises(ValueError, match="every replica must pass the same object") as info:
        await strategy(3).run(step)
    message = str(info.value)
    assert "replicas 0, 2 passed Mirrored at 0x" in message
    assert "replica 1 passed Mirrored at 0x" in message


async def test_update_in_replica_context_with_one_fn_and_one_var_still_updates() -> None:
    w = ar.Mirrored([1.0, 2.0])

    async def step() -> Any:
        ctx = _ctx()
        delta = 0.5 * (1 + ctx.replica_id_in_sync_group)
        return await ctx.strategy.extended.update(w, lambda x, d: x - d, args=(delta,))

    s = strategy()
    assert s.experimental_local_results(await s.run(step)) == (0.5, 1.0)
