"""Silent results found by the third attack (issue 23): each test failed before its fix.

B11 (listed as B12 in the brief): a step written as a generator function ran nothing.
B9: IndexedSlices indices that do not fit the common index dtype, or outside dense_shape.
B1: a backend's results that do not match the collective's signature.
B0c: a replica's helper task started in a fresh contextvars.Context().
B7: a collective driven by hand and abandoned after it was issued.
"""

from __future__ import annotations

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


# -- B11: a generator function as the step -------------------------------------------------


async def test_an_async_generator_step_is_refused() -> None:
    async def step() -> Any:
        yield await _ctx().all_reduce("SUM", 1.0)

    with pytest.raises(TypeError, match=r"(?s)step is an async generator function.*`return`"):
        await strategy().run(step)


async def test_a_generator_step_is_refused() -> None:
    def step() -> Any:
        yield 1.0

    with pytest.raises(TypeError, match=r"(?s)step is a generator function.*`return`"):
        await strategy().run(step)


# -- B9: IndexedSlices indices are row numbers of the dense value -------------------------


def _slices(indices: Any) -> ar.IndexedSlices:
    return ar.IndexedSlices(np.ones((1, 2)), indices, (3, 2))


@pytest.mark.parametrize(
    ("first", "second", "bad"),
    [
        (np.array([2**63 + 1], np.uint64), np.array([0], np.int32), "9223372036854775809"),
        (np.array([7]), np.array([0]), "7"),
        (np.array([-1]), np.array([0]), "-1"),
    ],
    ids=["uint64-above-int64", "out-of-range", "negative"],
)
async def test_indexed_slices_indices_outside_the_dense_rows_are_refused(
    first: Any, second: Any, bad: str
) -> None:
    async def step() -> Any:
        ctx = _ctx()
        mine = first if ctx.replica_id_in_sync_group == 0 else second
        return await ctx.all_reduce("SUM", _slices(mine))

    with pytest.raises(ValueError, match=rf"0 <= i < 3 \(dense_shape \(3, 2\)\), got {bad}:"):
        await strategy().run(step)


async def test_indexed_slices_with_the_last_row_and_no_rows_still_reduce() -> None:
    async def step() -> Any:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 0:
            mine = _slices(np.array([2], np.uint64))
        else:
            mine = ar.IndexedSlices(np.ones((0, 2)), np.zeros(0, np.int32), (3, 2))
        return await ctx.all_reduce("SUM", mine)

    result = (await strategy().run(step)).values[0]
    assert result.indices.tolist() == [2]
    assert result.indices.dtype == np.int64
