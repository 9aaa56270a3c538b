"""Defects found by the fifth attack (attack 23c): each test failed before its fix.

D1: a single leaf's dtype changed in place while its all_reduce was in flight was read
under the old signature (the batch path refused it).
D3: ``Strategy.reduce(PROD, complex, axis=...)`` to a 0-d result raised AttributeError.
D4: a merge_fn's BaseExceptionGroup was told as "2 replicas failed", once per replica.
D5: a merge_fn's BaseExceptionGroup of a cancellation escaped as anyio's raw task group.
D6: ``strategy.gather`` of a plain array returned the caller's own array.
(D2, which NaN a path returns, is held by tests/semantics/test_differential.py.)
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


# -- D4, D5: a merge_fn's BaseExceptionGroup is the merge_fn's one error ----------------------


@pytest.mark.parametrize("n", [2, 3])
async def test_a_merge_fn_base_exception_group_is_told_once(n: int) -> None:
    s = ar.MirroredStrategy(DEVICES[:n])

    async def merge_fn(strategy: ar.Strategy) -> None:
        raise BaseExceptionGroup("from merge_fn", [KeyboardInterrupt(), ValueError("bad")])

    async def step() -> Any:
        return await _ctx().merge_call(merge_fn)

    with pytest.raises(BaseExceptionGroup) as info:
        await s.run(step)
    error = info.value
    assert str(error) == "from merge_fn (2 sub-exceptions)"
    assert [type(e) for e in error.exceptions] == [KeyboardInterrupt, ValueError]
    notes = getattr(error, "__notes__", [])
    assert len(notes) == 1
    assert notes[0].startswith("(raised in merge_fn ")
    assert f"called once for all {n} replicas" in notes[0]


async def test_a_merge_fn_group_of_an_error_and_a_cancellation_is_told_once() -> None:
    """split() makes a new group per replica: still the merge_fn's one error."""
    s = ar.MirroredStrategy(DEVICES[:2])

    async def merge_fn(strategy: ar.Strategy) -> None:
        raise BaseExceptionGroup("mixed", [ValueError("bad"), KeyboardInterrupt()])

    async def step() -> Any:
        return await _ctx().merge_call(merge_fn)

    with pytest.raises(BaseExceptionGroup) as info:
        await s.run(step)
    assert "replicas failed" not in str(info.value)
    assert str(info.value).startswith("mixed")


async def test_a_merge_fn_group_of_a_cancellation_is_a_replica_cancelled_error() -> None:
    """As the same group raised in the step: a named error, not anyio's task group."""
    import asyncio

    s = ar.MirroredStrategy(DEVICES[:2])

    async def merge_fn(strategy: ar.Strategy) -> None:
        raise BaseExceptionGroup("inner", [asyncio.CancelledError()])

    async def step() -> Any:
        return await _ctx().merge_call(merge_fn)

    async def step_raises() -> Any:
        raise BaseExceptionGroup("inner", [asyncio.CancelledError()])

    for fn in (step, step_raises):
        with pytest.raises(ar.ReplicaCancelledError, match="was cancelled from outside"):
            await s.run(fn)


# -- D6: a cross-replica API never hands back the caller's own array --------------------------


@pytest.mark.parametrize("n", [0, 1, 2])
async def test_cross_replica_results_of_a_plain_array_are_new_arrays(n: int) -> None:
    s = ar.get_strategy() if n == 0 else ar.MirroredStrategy(DEVICES[:n])
    x = np.array([1.0, 2.0])
    e = s.extended
    results = {
        "gather": await s.gather(x, 0),
        "reduce": await s.reduce("mean", x, axis=None),
        "reduce axis": await s.reduce("max", x, axis=0),
        "reduce_to": await e.reduce_to("mean", x, "CPU:0"),
        "batch_reduce_to": (await e.batch_reduce_to("mean", [(x, "CPU:0")]))[0],
    }
    for name, got in results.items():
        got = np.asarray(got)
        assert not np.shares_memory(got, x), name
    gathered = results["gather"]
    assert isinstance(gathered, np.ndarray)
    assert gathered.flags.writeable
    gathered[0] = 100.0
    assert x.tolist() == [1.0, 2.0]
    # Immutable plain leaves come back as they are, as in TensorFlow.
    nest = await s.gather({"a": x, "n": 3}, 0)
    assert nest["n"] == 3
    assert nest["a"] is not x
    assert nest["a"].tolist() == [1.0, 2.0]
