"""Defects found by the fifth attack (attack 23c): each test failed before its fix.

D1: a single leaf's dtype changed in place while its all_reduce was in flight was read
under the old signature (the batch path refused it).
D3: ``Strategy.reduce(PROD, complex, axis=...)`` to a 0-d result raised AttributeError.
"""

from __future__ import annotations

import warnings
from collections.abc import Awaitable
from typing import Any

import numpy as np
import pytest

import asyncreplica as ar

pytestmark = pytest.mark.anyio

DEVICES = ["CPU:0", "CPU:1", "CPU:2"]


def _ctx() -> ar.ReplicaContext:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return ctx


def _reinterpret(x: np.ndarray, dtype: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy deprecates assigning .dtype; it still works
        x.dtype = dtype


# -- D1: a dtype changed in flight is refused on the single-leaf path as in a batch ----------


@pytest.mark.parametrize("batch", [False, True], ids=["single-leaf", "batch"])
async def test_a_dtype_changed_in_flight_is_refused(batch: bool) -> None:
    s = ar.MirroredStrategy(DEVICES[:2])

    async def step() -> Any:
        ctx = _ctx()
        x = np.array([1.0, 2.0]) * (ctx.replica_id_in_sync_group + 1)
        value: Any = [x, np.ones(1)] if batch else x
        pending: Awaitable[Any] = ctx.all_reduce("sum", value, name="g")
        if ctx.replica_id_in_sync_group == 0:
            _reinterpret(x, np.int64)  # same itemsize and shape: only the dtype differs
        return await pending

    with pytest.raises(ValueError, match=r"changed while its all_reduce.*was in flight") as info:
        await s.run(step)
    assert "leaf 0 was float64[2] when the collective was issued and is int64[2] now" in str(
        info.value
    )


async def test_a_leaf_of_an_unchanged_dtype_still_reduces() -> None:
    """The dtype comparison added to the single-leaf check refuses nothing else."""
    s = ar.MirroredStrategy(DEVICES[:2])

    async def step() -> Any:
        ctx = _ctx()
        out = []
        for dtype in ("float64", "float32", ">f8", "int32", "complex64"):
            out.append(await ctx.all_reduce("sum", np.ones(2, dtype)))
        out.append(await ctx.all_reduce("sum", 1.5))
        return out

    got = s.experimental_local_results(await s.run(step))[0]
    assert [str(np.asarray(g).dtype) for g in got] == [
        "float64",
        "float32",
        "float64",
        "int32",
        "complex64",
        "float64",
    ]


# -- D3: complex PROD along every axis ---------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize(("shape", "axis"), [((3,), 0), ((3,), -1), ((2, 2), (0, 1)), ((2, 2), 0)])
async def test_complex_prod_along_axes_matches_the_reference(
    n: int, shape: tuple[int, ...], axis: Any
) -> None:
    from asyncreplica.testing import _reference as ref

    s = ar.MirroredStrategy(DEVICES[:n])
    values = [
        (np.arange(4, dtype=np.complex128)[: int(np.prod(shape))] + 1 + 1j * r).reshape(shape)
        for r in range(n)
    ]
    got = np.asarray(
        await s.reduce("prod", ar.PerReplica(values) if n > 1 else values[0], axis=axis)
    )
    axes = (axis,) if isinstance(axis, int) else axis
    want = ref.reduce(ar.ReduceOp.PROD, values, tuple(a % len(shape) for a in axes))
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    assert got.tobytes() == want.tobytes()
