"""Misleading errors found by the third-round attack (issue 23, attack23 B2, B4-B6, B10-B12).

Each test failed before its fix: the error was told as another's (a backend's exception
as replica k's), told once per replica, or said something else than what happened.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest
from asyncreplica_numpy import NumpyBackend

import asyncreplica as ar

pytestmark = pytest.mark.anyio

DEVICES = ["CPU:0", "CPU:1", "CPU:2"]


def _ctx() -> ar.ReplicaContext:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return ctx


def _backend(kind: str) -> NumpyBackend:
    class Broken(NumpyBackend):
        async def all_reduce(self, op: Any, values: Any, *, bytes_per_pack: int = 0) -> Any:
            await anyio.lowlevel.checkpoint()
            if kind == "raises":
                raise ValueError("backend bug")
            result = await super().all_reduce(op, values, bytes_per_pack=bytes_per_pack)
            if kind == "short":
                return result[:-1]
            if kind == "leaves":
                return [[*list(leaves), np.zeros(1)] for leaves in result]
            return None

    return Broken(DEVICES[:2])


# -- B2: a backend's exception is the backend's, not replica k's --------------------------


async def test_backend_exception_is_noted_as_the_backends_not_a_replicas() -> None:
    strategy = ar.MirroredStrategy(DEVICES[:2], backend=_backend("raises"))

    async def step() -> Any:
        return await _ctx().all_reduce("SUM", np.ones(2))

    with pytest.raises(ValueError, match="backend bug") as info:
        await strategy.run(step)
    notes = getattr(info.value, "__notes__", [])
    assert not any("raised in replica" in n for n in notes), notes
    assert any(
        "raised in the 'numpy' backend's all_reduce (Broken.all_reduce), combining the 1st "
        "collective (position 0)" in n
        for n in notes
    ), notes


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("short", "it returned 1 results for 2 replicas"),
        ("none", "it returned NoneType, not one list of leaves per replica"),
        ("leaves", "replica 0's results are list of 2 leaves where it gave 1 leaves"),
    ],
)
async def test_backend_returning_the_wrong_layout_is_a_backend_error(kind: str, said: str) -> None:
    strategy = ar.MirroredStrategy(DEVICES[:2], backend=_backend(kind))

    async def step() -> Any:
        return await _ctx().all_reduce("SUM", np.ones(2))

    with pytest.raises(ar.BackendError) as info:  # one error, not one per replica
        await strategy.run(step)
    message = str(info.value)
    assert said in message
    assert "Broken.all_reduce" in message
    assert "bug in the backend" in message
    assert "bug in asyncreplica" not in message
    notes = getattr(info.value, "__notes__", [])
    assert not any("raised in replica" in n for n in notes), notes


# -- B6: extended precision is a float, refused for what it is ------------------------------


@pytest.mark.skipif(np.dtype(np.longdouble) == np.float64, reason="longdouble is float64 here")
async def test_longdouble_is_refused_as_extended_precision_not_as_a_non_float() -> None:
    strategy = ar.MirroredStrategy(DEVICES[:2])

    async def step() -> Any:
        return await _ctx().all_reduce("SUM", np.ones(2, dtype=np.longdouble))

    with pytest.raises(TypeError) as info:
        await strategy.run(step)
    message = str(info.value)
    assert "extended precision (numpy's longdouble) is not supported" in message
    assert "x.astype(np.float64)" in message
    assert "need integer, float or complex" not in message


# -- B12: MAX/MIN along an axis with no elements: a named error, in the reference too ------


@pytest.mark.parametrize("op", ["MAX", "MIN"])
async def test_reduce_max_min_of_an_empty_replica_batch_is_a_named_error(op: str) -> None:
    strategy = ar.MirroredStrategy(DEVICES[:3])
    value = ar.PerReplica((np.array([1.0]), np.zeros((0,)), np.zeros((0,))))
    with pytest.raises(ValueError, match=r"replicas 1, 2 hold values with no elements") as info:
        await strategy.reduce(op, value, axis=0)
    message = str(info.value)
    assert f"{op} of no elements has no identity" in message
    assert "zero-size array" not in message
    with pytest.raises(ValueError, match="the value \\(not distributed\\) has no elements"):
        await strategy.reduce(op, np.zeros((0, 2)), axis=0)
    # SUM, PROD and MEAN have identities (0, 1, NaN): unchanged.
    assert float(await strategy.reduce("SUM", value, axis=0)) == 1.0


def test_reference_refuses_max_of_an_empty_component_with_the_same_error() -> None:
    from asyncreplica._core._signature import ReduceOp
    from asyncreplica.testing import _reference

    with pytest.raises(ValueError, match="replica 0 holds a value with no elements"):
        _reference.reduce(ReduceOp.MAX, [np.zeros((0,)), np.array([1.0])], (0,))


# -- B11: a name is its characters, whatever its str subclass says --------------------------


class _HashById(str):
    __slots__ = ()

    def __hash__(self) -> int:
        return id(self)


class _EqualsAll(str):
    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return 0  # with __eq__: every name is every other name, to a dict


async def test_a_str_subclass_name_that_hashes_by_identity_pairs_by_its_characters() -> None:
    strategy = ar.MirroredStrategy(DEVICES[:2])

    async def step() -> Any:
        ctx = _ctx()
        return await ctx.all_reduce(
            "SUM", float(ctx.replica_id_in_sync_group + 1), name=_HashById("g")
        )

    assert [float(x) for x in strategy.experimental_local_results(await strategy.run(step))] == [
        3.0,
        3.0,
    ]


async def test_str_subclass_names_issued_in_swapped_order_pair_by_their_characters() -> None:
    strategy = ar.MirroredStrategy(DEVICES[:2])

    async def step() -> Any:
        ctx = _ctx()
        r = ctx.replica_id_in_sync_group
        names = ["a", "b"] if r == 0 else ["b", "a"]
        value = {"a": 1.0, "b": 10.0}
        done: dict[str, float] = {}

        async def one(name: str) -> None:
            done[name] = float(
                await ctx.all_reduce("SUM", value[name] * (r + 1), name=_EqualsAll(name))
            )

        async with anyio.create_task_group() as tg:
            for name in names:
                tg.start_soon(one, name)
        return done["a"], done["b"]

    results = strategy.experimental_local_results(await strategy.run(step))
    assert list(results) == [(3.0, 30.0), (3.0, 30.0)]


# -- B10: a value whose __repr__ raises is told as the value it is ---------------------------


class _BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("repr broke")


class _ArrayRaises:
    def __array__(self, dtype: object = None, copy: object = None) -> Any:
        raise KeyError("array broke")


async def test_a_value_whose_repr_raises_is_refused_as_a_value_the_backend_cannot_hold() -> None:
    strategy = ar.MirroredStrategy(DEVICES[:2])

    async def step() -> Any:
        return await _ctx().all_reduce("SUM", _BadRepr())

    with pytest.raises(TypeError, match="numpy backend cannot hold") as info:
        await strategy.run(step)
    assert "_BadRepr object whose __repr__ failed" in str(info.value)


async def test_an_array_conversion_error_is_told_in_the_refusal() -> None:
    strategy = ar.MirroredStrategy(DEVICES[:2])

    async def step() -> Any:
        return await _ctx().all_reduce("SUM", _ArrayRaises())

    with pytest.raises(TypeError, match="cannot hold") as info:
        await strategy.run(step)
    assert "converting it to an array raised KeyError: 'array broke'" in str(info.value)


async def test_collective_arguments_whose_repr_raises_are_refused_by_type() -> None:
    strategy = ar.MirroredStrategy(DEVICES[:2])

    async def step() -> Any:
        return await _ctx().all_reduce("SUM", 1.0, name=_BadRepr())  # type: ignore[arg-type]

    with pytest.raises(TypeError, match="name must be a string or None, got <_BadRepr object"):
        await strategy.run(step)


# -- B4: StopIteration from a plain step or a sync merge_fn is told where it came from ------


async def test_a_plain_steps_stopiteration_is_a_runtime_error_noted_with_its_replica() -> None:
    strategy = ar.MirroredStrategy(DEVICES[:2])

    def step() -> Any:
        if _ctx().replica_id_in_sync_group == 1:
            raise StopIteration("exhausted")
        return 1.0

    with pytest.raises(RuntimeError, match="the step function raised StopIteration") as info:
        await strategy.run(step)
    assert isinstance(info.value.__cause__, StopIteration)
    assert getattr(info.value, "__notes__", []) == [
        "(raised in replica 1 of 2 in MirroredStrategy.run)"
    ]


async def test_a_sync_merge_fns_stopiteration_is_noted_as_merge_fns_not_a_replicas() -> None:
    strategy = ar.MirroredStrategy(DEVICES[:2])

    def merge_fn(strategy: Any, value: Any) -> Any:
        raise StopIteration("exhausted")

    async def step() -> Any:
        return await _ctx().merge_call(merge_fn, args=(1.0,))

    with pytest.raises(RuntimeError, match=r"merge_fn .*merge_fn raised StopIteration") as info:
        await strategy.run(step)
    notes = getattr(info.value, "__notes__", [])
    assert not any("raised in replica" in n for n in notes), notes
    assert any("called once for all 2 replicas" in n for n in notes), notes


# -- B5/B6b: a refusal every replica raises alike is told once, naming them all -------------


async def test_a_collective_awaited_twice_on_every_replica_is_told_once() -> None:
    strategy = ar.MirroredStrategy(DEVICES[:2])

    async def step() -> Any:
        collective = _ctx().all_reduce("SUM", 1.0)
        first = await collective
        return first, await collective

    with pytest.raises(ar.CollectiveError) as info:  # one error, not a group of two
        await strategy.run(step)
    assert str(info.value).startswith("Each of replicas 0, 1 awaited all_reduce(SUM)")
    assert "again, after it completed" in str(info.value)


async def test_an_async_generator_finalized_by_the_loop_is_told_once_and_why(
    anyio_backend: object,
) -> None:
    if anyio_backend == "trio" or (isinstance(anyio_backend, tuple) and anyio_backend[0] == "trio"):
        pytest.skip("trio finalizes async generators in a system task of its own, after the run")
    import gc

    strategy = ar.MirroredStrategy(DEVICES[:2])

    async def agen(ctx: ar.ReplicaContext) -> Any:
        try:
            yield 1
        finally:
            await ctx.all_reduce("SUM", 1.0)

    async def step() -> Any:
        ctx = _ctx()
        async for _ in agen(ctx):
            break
        gc.collect()  # the loop's finalizer hook closes the generator in a task of its own
        await anyio.lowlevel.checkpoint()
        await anyio.lowlevel.checkpoint()
        return 7.0

    with pytest.raises(ar.CollectiveError) as info:
        await strategy.run(step)
    message = str(info.value)
    assert message.startswith("Each of replicas 0, 1 issued all_reduce(SUM)")
    assert "the event loop closing an async generator" in message
    assert "contextlib.aclosing" in message


# -- B8: a replica's own helper fails while a merge_fn runs ------------------------------


async def test_a_helper_failing_while_merge_fn_runs_is_its_replicas_one_failure() -> None:
    """Before, on asyncio: "2 replicas failed", both about replica 0 (its leaving the
    merge_call, cancelled by its own task group, and the helper's ValueError). Now one
    failure on every loop, as trio told it: replica 0's, the helper's ValueError. (trio
    runs merge_fn in any replica's task, replica 0's included: both stories are here.)"""
    running = anyio.Event()

    async def merge_fn(strategy: ar.Strategy, value: Any) -> Any:
        running.set()
        await anyio.sleep_forever()

    async def step() -> Any:
        ctx = _ctx()
        rid = ctx.replica_id_in_sync_group

        async def helper() -> None:
            await running.wait()
            raise ValueError("helper failed")

        async with anyio.create_task_group() as tg:
            if rid == 0:
                tg.start_soon(helper)
            return await ctx.merge_call(merge_fn, args=(float(rid),))

    with anyio.fail_after(10), pytest.raises(BaseExceptionGroup) as info:
        await ar.MirroredStrategy(DEVICES[:3]).run(step)
    error = info.value
    assert "replicas failed" not in str(error), error
    assert error.__notes__ == ["(raised in replica 0 of 3 in MirroredStrategy.run)"]
    leaves = error.exceptions
    assert len(leaves) == 1
    assert isinstance(leaves[0], ValueError), leaves
    assert str(leaves[0]) == "helper failed"
