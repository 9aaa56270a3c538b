"""Errors say what really happened: merge_call arguments, and names given on some replicas only.

* A merge_call whose replicas pass arguments of different structure raises
  ``CollectiveMismatchError`` when the first disagreeing replica arrives, and calls them
  arguments (not "returned values"), naming which replicas passed which structure.
* A collective named on some replicas and unnamed on others is reported as such, not as a
  wait cycle to be fixed by ordering names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import asyncreplica as ar

pytestmark = pytest.mark.anyio

HANG_GUARD = 10.0
_HERE = Path(__file__)
_SOURCE = _HERE.read_text(encoding="utf-8").splitlines()
_FILE = f"{_HERE.parent.name}/{_HERE.name}"


def at(marker: str) -> str:
    hits = [n for n, text in enumerate(_SOURCE, 1) if text.rstrip().endswith(f"# @{marker}")]
    assert len(hits) == 1
    return f"{_FILE}:{hits[0]}"


def strategy(n: int) -> ar.MirroredStrategy:
    return ar.MirroredStrategy([f"CPU:{i}" for i in range(n)])


def context() -> ar.ReplicaContext:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return ctx


def merge(strategy: ar.Strategy, *args: Any, **kwargs: Any) -> int:
    return 0


async def test_merge_call_arguments_of_different_structure_name_the_replicas() -> None:
    s = strategy(3)

    async def step() -> object:
        ctx = context()
        rid = ctx.replica_id_in_sync_group
        if rid == 2:
            await anyio.wait_all_tasks_blocked()  # arrives last: everyone is in the message
        args = (1.0, 2.0) if rid == 2 else (1.0,)
        return await ctx.merge_call(merge, args=args)  # @merge

    with anyio.fail_after(HANG_GUARD), pytest.raises(ar.CollectiveMismatchError) as info:
        await s.run(step)
    error = info.value
    assert error.fields == ("structure",)
    message = str(error)
    assert message.splitlines()[0] == (
        "Replicas disagree about their 1st collective (position 0): merge_call arguments differ."
    )
    assert "returned values" not in message
    assert f"  * replicas 0, 1 called merge_call(merge) with args (*,) at {at('merge')}" in message
    assert f"  * replica 2 called merge_call(merge) with args (*, *) at {at('merge')}" in message
    assert "merge_call regroups the replicas' args and kwargs" in message
    assert sorted(error.signatures) == [0, 1, 2]


async def test_merge_call_kwargs_with_different_keys_are_caught_at_the_first_disagreement() -> None:
    s = strategy(2)

    async def step() -> object:
        ctx = context()
        if ctx.replica_id_in_sync_group == 1:
            await anyio.wait_all_tasks_blocked()
        key = "scale" if ctx.replica_id_in_sync_group == 0 else "shift"
        return await ctx.merge_call(merge, kwargs={key: 1.0})

    with anyio.fail_after(HANG_GUARD), pytest.raises(ar.CollectiveMismatchError) as info:
        await s.run(step)
    message = str(info.value)
    assert "with args () and kwargs {'scale': *}" in message
    assert "with args () and kwargs {'shift': *}" in message


async def test_merge_call_arguments_that_agree_up_to_key_order_are_regrouped() -> None:
    s = strategy(2)

    async def add(strategy: ar.Strategy, a: Any, b: Any) -> Any:
        return await strategy.reduce("sum", a, axis=None), await strategy.reduce(
            "sum", b, axis=None
        )

    async def step() -> object:
        ctx = context()
        rid = float(ctx.replica_id_in_sync_group)
        kwargs = {"a": rid, "b": 10 * rid} if rid == 0 else {"b": 10 * rid, "a": rid}
        return await ctx.merge_call(add, kwargs=kwargs)

    with anyio.fail_after(HANG_GUARD):
        result = await s.run(step)
    a, b = result
    assert np.asarray(a) == 1.0
    assert np.asarray(b) == 10.0


async def test_a_name_given_on_some_replicas_only_is_reported_as_such() -> None:
    s = strategy(3)

    async def step() -> None:
        ctx = context()
        if ctx.replica_id_in_sync_group == 2:
            await ctx.all_reduce("sum", 1.0)  # @unnamed
        else:
            await ctx.all_reduce("sum", 1.0, name="loss")  # @named

    with anyio.fail_after(HANG_GUARD), pytest.raises(ar.CollectiveDeadlockError) as info:
        await s.run(step)
    message = str(info.value)
    first = message.splitlines()[0]
    assert first.startswith("Replica")
    assert "at a named collective while replica 2 waits at an unnamed one" in first
    assert "can never pair up" in first
    assert f"all_reduce(SUM) on float64[] at {at('unnamed')}" in message
    assert f"all_reduce(SUM, name='loss') on float64[] at {at('named')}" in message
    assert "pass the same name= on every replica, or none" in message
    assert "in the same order" not in message  # not advice about ordering names
