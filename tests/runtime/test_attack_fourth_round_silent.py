"""Silent results found by the fourth attack (issue 23, attack23b): each failed before its fix.

C14: extended.update in replica context ran replica 0's fn for every replica.
C4: an IndexedSlices index above int64, where dense_shape admits it, wrapped on 5 APIs.
C5: a step that returned a generator, where inspect does not see a generator function, ran
nothing; a ``@types.coroutine`` step was refused as a generator function.
C12: ctx.broadcast of IndexedSlices was accepted at issue, then failed in numpy's internals.
"""

from __future__ import annotations

import functools
import re
import types
from typing import Any

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


# -- C4: IndexedSlices indices fit int64 on every path ---------------------------------------

_HUGE = (2**64 - 1, 1)  # a dense_shape that admits an index above int64


def _huge_pair(bad: int) -> tuple[ar.IndexedSlices, ar.IndexedSlices]:
    above = ar.IndexedSlices(np.ones((1, 1)), np.array([2**63 + 1], np.uint64), _HUGE)
    fine = ar.IndexedSlices(np.ones((1, 1)), np.array([0], np.int32), _HUGE)
    return (above, fine) if bad == 0 else (fine, above)


async def _reduce_huge(api: str, bad: int) -> Any:
    pair = _huge_pair(bad)
    value = ar.PerReplica(pair)
    s = strategy()
    if api == "all_reduce":

        async def step() -> Any:
            ctx = _ctx()
            return await ctx.all_reduce("SUM", pair[ctx.replica_id_in_sync_group])

        return await s.run(step)
    if api == "reduce":
        return await s.reduce("SUM", value, axis=None)
    if api == "reduce_to":
        return await s.extended.reduce_to("SUM", value, "CPU:0")
    if api == "reduce_to_mirrored":
        return await s.extended.reduce_to("SUM", value, value)
    if api == "batch_reduce_to":
        return await s.extended.batch_reduce_to("SUM", [(value, value)])

    async def merge(strategy: Any, v: Any) -> Any:
        return await strategy.extended.reduce_to("SUM", v, "CPU:0")

    async def merge_step() -> Any:
        ctx = _ctx()
        return await ctx.merge_call(merge, args=(pair[ctx.replica_id_in_sync_group],))

    return await s.run(merge_step)


@pytest.mark.parametrize("bad", [0, 1])
@pytest.mark.parametrize(
    "api",
    ["all_reduce", "reduce", "reduce_to", "reduce_to_mirrored", "batch_reduce_to", "merge_call"],
)
async def test_an_indexed_slices_index_above_int64_is_refused_on_every_path(
    api: str, bad: int
) -> None:
    with pytest.raises(
        ValueError, match=r"0 <= i < 2\*\*63 \(int64, .*got 9223372036854775809"
    ) as info:
        await _reduce_huge(api, bad)
    notes = " ".join(getattr(info.value, "__notes__", []))
    if api == "all_reduce":
        assert f"(raised in replica {bad} of 2" in notes
    elif api != "merge_call":  # a merge_fn's reduce_to: its note says the merge_fn's too
        assert f"(in replica {bad}'s component of the distributed value)" in notes


async def test_indexed_slices_below_int64_with_a_huge_dense_shape_still_reduce() -> None:
    a = ar.IndexedSlices(np.ones((1, 1)), np.array([2**63 - 1], np.uint64), _HUGE)
    b = ar.IndexedSlices(np.ones((1, 1)), np.array([0], np.int32), _HUGE)
    s = strategy()
    result = await s.reduce("SUM", ar.PerReplica((a, b)), axis=None)
    assert result.indices.tolist() == [2**63 - 1, 0]
    assert result.indices.dtype == np.int64


async def test_a_bad_component_of_a_cross_replica_reduce_names_its_replica() -> None:
    good = ar.IndexedSlices(np.ones((1, 2)), np.array([0]), (3, 2))
    bad = ar.IndexedSlices(np.ones((1, 2)), np.array([-1]), (3, 2))
    s = strategy(3)
    with pytest.raises(ValueError, match="got -1") as info:
        await s.reduce("SUM", ar.PerReplica((good, good, bad)), axis=None)
    assert "(in replica 2's component of the distributed value)" in info.value.__notes__
    with pytest.raises(ValueError, match="got -1") as info:
        await s.gather(ar.PerReplica((good, bad, good)), axis=0)
    assert "(in replica 1's component of the distributed value)" in info.value.__notes__


# -- C5: a step is refused by what its call returns -------------------------------------------


async def _agen_step() -> Any:
    yield await _ctx().all_reduce("SUM", 1.0)


def _gen_step() -> Any:
    yield 1.0


class _CallableAgen:
    async def __call__(self) -> Any:
        yield await _ctx().all_reduce("SUM", 1.0)


def _wrapped(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


HIDDEN = {
    "callable_object": (_CallableAgen(), "calling the _CallableAgen object returned an async"),
    "lambda_agen": (lambda: _agen_step(), "calling <lambda> returned an async generator object"),
    "lambda_gen": (lambda: _gen_step(), "calling <lambda> returned a generator object"),
    "aiter": (lambda: _agen_step().__aiter__(), "returned an async generator object"),
    "wrapped": (_wrapped(_agen_step), "calling _agen_step returned an async generator object"),
}


@pytest.mark.parametrize("case", list(HIDDEN))
async def test_a_step_that_returns_a_generator_is_refused(case: str) -> None:
    step, message = HIDDEN[case]
    with pytest.raises(TypeError, match=message) as info:
        await strategy().run(step)
    assert "no replica would run its collectives" in str(info.value)


@pytest.mark.parametrize("case", ["lambda_agen", "lambda_gen"])
async def test_the_default_strategy_refuses_a_step_that_returns_a_generator(case: str) -> None:
    with pytest.raises(TypeError, match=HIDDEN[case][1]):
        await ar.get_strategy().run(HIDDEN[case][0])


@types.coroutine
def _coroutine_step() -> Any:
    return (yield from _ctx().all_reduce("SUM", 1.0).__await__())


async def test_a_types_coroutine_step_is_a_coroutine_not_refused() -> None:
    s = strategy()
    assert s.experimental_local_results(await s.run(_coroutine_step)) == (2.0, 2.0)
    assert s.experimental_local_results(await s.run(functools.partial(_coroutine_step))) == (
        2.0,
        2.0,
    )


async def test_a_partial_of_a_generator_function_is_refused_by_its_name() -> None:
    with pytest.raises(TypeError, match=r"functools.partial\(_gen_step\) is a generator function"):
        await strategy().run(functools.partial(_gen_step))


# -- C12: broadcast refuses IndexedSlices at issue ---------------------------------------------


@pytest.mark.parametrize("n", [1, 2])
async def test_broadcast_of_indexed_slices_is_refused_at_issue_naming_the_replica(n: int) -> None:
    async def step() -> Any:
        ctx = _ctx()
        r = ctx.replica_id_in_sync_group
        value = {"w": np.zeros(2), "g": ar.IndexedSlices(np.ones((1, 2)) * (r + 1), [r], (3, 2))}
        return await ctx.broadcast(value, source=n - 1)

    with pytest.raises(NotImplementedError) as info:
        await strategy(n).run(step)
    message = str(info.value)
    assert message.startswith("broadcast does not support IndexedSlices (leaf 0, IndexedSlices(")
    assert "extended.broadcast_to" in message
    notes = " ".join(info.value.__notes__)
    assert re.search(rf"\(raised in replica \d of {n} in MirroredStrategy.run\)", notes), notes
    assert "backend" not in notes


async def test_broadcast_of_indexed_slices_in_the_default_context_is_refused() -> None:
    ctx = ar.get_replica_context()
    assert ctx is not None
    with pytest.raises(NotImplementedError, match="broadcast does not support IndexedSlices"):
        await ctx.broadcast(ar.IndexedSlices(np.ones((1, 2)), [0], (3, 2)))


async def test_broadcast_to_still_copies_indexed_slices() -> None:
    s = strategy()
    value = ar.IndexedSlices(np.ones((1, 2)), np.array([1]), (3, 2))
    copies = await s.extended.broadcast_to(value, ["CPU:0", "CPU:1"])
    assert [c.indices.tolist() for c in copies.values] == [[1], [1]]
