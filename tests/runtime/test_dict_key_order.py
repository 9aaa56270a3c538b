"""Dicts with equal keys are one structure, whatever order their keys were inserted in.

TensorFlow's ``nest`` sorts dict keys, and so do the checks across processes: replicas
that build the same dict in different orders agree in one process too. Each replica's
result keeps the replica's own key order.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import anyio
import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._core._nest import flatten, unflatten


def test_treedefs_of_equal_key_sets_are_equal_and_hash_alike() -> None:
    ab, ba = flatten({"a": 1, "b": 2})[1], flatten({"b": 2, "a": 1})[1]
    assert ab == ba
    assert hash(ab) == hash(ba)
    # Each still rebuilds its own order.
    assert list(unflatten(ba, [1, 2])) == ["b", "a"]  # type: ignore[call-overload]
    assert list(unflatten(ab, [1, 2])) == ["a", "b"]  # type: ignore[call-overload]
    # Different keys, or a different mapping type, are still different structures.
    assert flatten({"a": 1, "b": 2})[1] != flatten({"a": 1, "c": 2})[1]
    assert flatten({"a": 1, "b": 2})[1] != flatten(OrderedDict(b=2, a=1))[1]


def ordered(rid: int, **items: Any) -> dict[str, Any]:
    """``items`` inserted in sorted order on even replicas, reversed on odd ones."""
    keys = sorted(items)
    return {k: items[k] for k in (keys if rid % 2 == 0 else keys[::-1])}


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "broadcast", "reduce_scatter"])
def test_replicas_may_insert_dict_keys_in_different_orders(kind: str) -> None:
    """It raised a mismatch whose message showed two identical structures."""
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        rid = ctx.replica_id_in_sync_group
        x = ordered(rid, a=np.arange(3.0) + rid, b={"y": np.float64(rid), "x": np.ones(3) * rid})
        if kind == "all_reduce":
            out = await ctx.all_reduce("sum", x)
        elif kind == "all_gather":
            out = await ctx.all_gather(ordered(rid, a=np.arange(3.0), c=np.ones((1, 2))), axis=0)
        elif kind == "broadcast":
            out = await ctx.broadcast(x, source=1)
        else:
            out = await ctx.reduce_scatter("sum", ordered(rid, a=np.arange(6.0), c=np.ones(3)), 0)
        return rid, list(out), out

    async def main() -> Any:
        with anyio.fail_after(10):  # hang guard
            return await strategy.run(step)

    results = strategy.experimental_local_results(anyio.run(main))
    for rid, keys, out in results:
        # Each replica gets its result in its own key order.
        assert keys == (sorted(keys) if rid % 2 == 0 else sorted(keys)[::-1])
        assert isinstance(out, dict)
    if kind == "all_reduce":
        for _, _, out in results:
            np.testing.assert_array_equal(out["a"], np.arange(3.0) * 3 + 3)
            assert float(out["b"]["y"]) == 3.0
    if kind == "all_gather":
        assert results[1][2]["c"].shape == (3, 2)
    if kind == "broadcast":
        for _, _, out in results:
            np.testing.assert_array_equal(out["a"], np.arange(3.0) + 1)


def test_merge_call_and_run_results_accept_any_key_order() -> None:
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])

    def merge_fn(s: ar.Strategy, value: Any) -> Any:
        return sorted(value)

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        rid = ctx.replica_id_in_sync_group
        keys = await ctx.merge_call(merge_fn, args=(ordered(rid, p=1, q=2),))
        return ordered(rid, keys=keys, who=rid)

    async def main() -> Any:
        with anyio.fail_after(10):  # hang guard
            return await strategy.run(step)

    result = anyio.run(main)
    assert list(result) == ["keys", "who"]  # replica 0's order, as TensorFlow's regroup
    assert strategy.experimental_local_results(result["who"]) == (0, 1)


def test_different_key_sets_still_raise_a_mismatch() -> None:
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        key = "a" if ctx.replica_id_in_sync_group == 0 else "b"
        return await ctx.all_reduce("sum", {key: 1.0})

    async def main() -> Any:
        with anyio.fail_after(10):  # hang guard
            return await strategy.run(step)

    with pytest.raises(ar.CollectiveMismatchError, match="structure"):
        anyio.run(main)


@pytest.mark.anyio
async def test_structure_errors_name_global_replica_ids() -> None:
    # What process 1 of an MPI launch (global replicas 2, 3) sees, in one process: the
    # strategy's offset is the global id of its first replica.
    s = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    s._replica_offset = 2

    async def step() -> object:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return [1.0] * (ctx.replica_id_in_sync_group - 1)

    with pytest.raises(ValueError, match=r"replica 2 gave \[\*\] but replica 3 gave \[\*, \*\]"):
        await s.run(step)
    with pytest.raises(ValueError, match=r"replica 2 gave .* but replica 3 gave"):
        s.experimental_distribute_values_from_function(lambda c: [0] * c.replica_id_in_sync_group)
