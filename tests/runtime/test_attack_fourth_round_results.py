"""Backend results found unchecked by the fourth attack (issue 23, attack23b): each failed before its fix.

C1: a backend's wrong result (shape, dtype) passed through every cross-replica API
(``Strategy.reduce``, ``extended.reduce_to``/``batch_reduce_to``, ``broadcast_to``,
``reduce_to`` in a merge_fn); only ``run``'s collectives and ``Strategy.gather`` held it
to ``result_fits``. Now every path holds it there, in one place (``hold_results``).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from asyncreplica_numpy import NumpyBackend

import asyncreplica as ar

pytestmark = pytest.mark.anyio

DEVICES = ["CPU:0", "CPU:1"]


def _ctx() -> ar.ReplicaContext:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return ctx


class _Liar(NumpyBackend):
    """A third-party backend whose every combine answers with a wrong shape or dtype."""

    def __init__(self, kind: str) -> None:
        super().__init__(DEVICES)
        self.kind = kind

    def _lie(self, x: Any) -> Any:
        x = np.asarray(x)
        if self.kind == "shape":
            return np.zeros((*x.shape, 1), x.dtype) + 7
        return x.astype(np.float32)

    async def all_reduce(self, op: Any, values: Any, *, bytes_per_pack: int = 0) -> Any:
        r = await super().all_reduce(op, values, bytes_per_pack=bytes_per_pack)
        return [[self._lie(x) for x in leaves] for leaves in r]

    async def reduce(self, op: Any, components: Any, axis: Any) -> Any:
        return self._lie(await super().reduce(op, components, axis))

    async def gather(self, components: Any, axis: int) -> Any:
        return self._lie(await super().gather(components, axis))

    async def broadcast(self, values: Any, num_replicas: int) -> Any:
        r = await super().broadcast(values, num_replicas)
        return [[self._lie(x) for x in leaves] for leaves in r]


def _pr() -> ar.PerReplica[Any]:
    return ar.PerReplica((np.ones(2), np.ones(2)))


async def _merge_reduce(s: ar.Strategy) -> Any:
    async def step() -> Any:
        async def mf(strategy: ar.Strategy, v: Any) -> Any:
            return await strategy.extended.reduce_to("SUM", v, v)

        return await _ctx().merge_call(mf, args=(np.ones(2),))

    return await s.run(step)


API: dict[str, tuple[Callable[[ar.Strategy], Awaitable[Any]], str]] = {
    "reduce": (lambda s: s.reduce("SUM", _pr(), axis=None), "reduce"),
    "reduce_axis": (lambda s: s.reduce("MEAN", _pr(), axis=0), "reduce"),
    "reduce_numbers": (
        lambda s: s.reduce("SUM", ar.PerReplica((1.0, 2.0)), axis=None),
        "all_reduce",
    ),
    "reduce_plain": (lambda s: s.reduce("MEAN", np.ones(2), axis=None), "reduce"),
    "reduce_plain_axis": (lambda s: s.reduce("MEAN", np.ones(2), axis=0), "reduce"),
    "reduce_to_mirrored": (lambda s: s.extended.reduce_to("SUM", _pr(), _pr()), "all_reduce"),
    "reduce_to_one": (lambda s: s.extended.reduce_to("SUM", _pr(), "CPU:0"), "all_reduce"),
    "batch_reduce_to": (
        lambda s: s.extended.batch_reduce_to("SUM", [(_pr(), _pr())]),
        "all_reduce",
    ),
    "gather": (lambda s: s.gather(_pr(), axis=0), "gather"),
    "broadcast_to": (lambda s: s.extended.broadcast_to(np.ones(2), DEVICES), "broadcast"),
    "broadcast_to_one": (lambda s: s.extended.broadcast_to(np.ones(2), "CPU:0"), "reduce"),
    "merge_fn_reduce_to": (_merge_reduce, "all_reduce"),
}


@pytest.mark.parametrize("kind", ["shape", "dtype"])
@pytest.mark.parametrize("api", list(API))
async def test_every_cross_replica_api_holds_the_backend_result_to_the_one_rule(
    api: str, kind: str
) -> None:
    call, method = API[api]
    s = ar.MirroredStrategy(DEVICES, backend=_Liar(kind))
    with pytest.raises(ar.BackendError) as info:
        await call(s)
    message = str(info.value)
    assert f"broke its contract in the 'numpy' backend's {method} (_Liar.{method})" in message
    got = r"float64\[[0-9,]*,?1\]" if kind == "shape" else r"float32\["
    assert re.search(rf"returned {got}.* was due", message), message
    assert "bug in the backend" in message


@pytest.mark.parametrize(
    ("value", "axis", "dtype", "shape"),
    [
        (ar.PerReplica((np.int64(1), np.int64(2))), None, np.float64, ()),
        (ar.PerReplica((np.arange(4, dtype=np.int32),) * 2), 0, np.float64, ()),
        (ar.PerReplica((1, 2)), None, np.float64, ()),
        (3, None, np.int32, ()),
        (2.5, None, np.float32, ()),
        (np.ones((2, 3), np.int16), 1, np.float64, (2,)),
    ],
)
async def test_honest_results_pass_the_cross_replica_check(
    value: Any, axis: Any, dtype: Any, shape: tuple[int, ...]
) -> None:
    s = ar.MirroredStrategy(DEVICES)
    result = await s.reduce("MEAN", value, axis=axis)
    assert (np.asarray(result).dtype, np.shape(result)) == (np.dtype(dtype), shape)


# -- C2: results that alias one another, or are not the backend's arrays ---------------------


class _Fake:
    """An object that only claims an array's shape and dtype."""

    def __init__(self, shape: tuple[int, ...], dtype: Any) -> None:
        self.shape, self.dtype = shape, dtype


def _odd(kind: str, values: Any) -> Any:
    total = sum(np.asarray(v[0]) for v in values)
    if kind == "alias_input":  # replica 0's input, holding the sum, for every replica
        values[0][0][...] = total
        return [[values[0][0]] for _ in values]
    if kind == "shared_writable":
        return [[total] for _ in values]
    if kind == "shared_memory":  # two writable views of one buffer
        return [[total[:]] for _ in values]
    if kind == "fake":
        return [[_Fake(total.shape, total.dtype)] for _ in values]
    if kind == "list":
        return [[total.tolist()] for _ in values]
    if kind == "masked":
        return [[np.ma.masked_array(total.copy(), mask=[True, False])] for _ in values]
    if kind == "own_copies":  # the contract kept: each replica its own writable array
        return [[total.copy()] for _ in values]
    raise AssertionError(kind)


class _Odd(NumpyBackend):
    def __init__(self, kind: str) -> None:
        super().__init__(DEVICES)
        self.kind = kind

    async def all_reduce(self, op: Any, values: Any, *, bytes_per_pack: int = 0) -> Any:
        return _odd(self.kind, values)


ODD = {
    "alias_input": r"one writable ndarray as leaf 0 of replica 1's result whose memory",
    "shared_writable": r"one writable ndarray as leaf 0 of replica 1's result whose memory",
    "shared_memory": r"one writable ndarray as leaf 0 of replica 1's result whose memory",
    "fake": r"returned a _Fake as leaf 0 of replica 0's result, where float64\[2\] was due",
    "list": r"returned a list as leaf 0 of replica 0's result, where float64\[2\] was due",
    "masked": r"returned a MaskedArray as leaf 0 of replica 0's result",
}


@pytest.mark.parametrize("kind", list(ODD))
async def test_a_result_that_aliases_or_is_not_an_array_is_a_backend_error(kind: str) -> None:
    inputs = [np.ones(2), np.ones(2) * 2]

    async def step() -> Any:
        return await _ctx().all_reduce("SUM", inputs[_ctx().replica_id_in_sync_group])

    with pytest.raises(ar.BackendError, match=ODD[kind]):
        await ar.MirroredStrategy(DEVICES, backend=_Odd(kind)).run(step)


async def test_each_replicas_own_writable_result_passes() -> None:
    async def step() -> Any:
        return await _ctx().all_reduce("SUM", np.ones(2))

    s = ar.MirroredStrategy(DEVICES, backend=_Odd("own_copies"))
    for result in s.experimental_local_results(await s.run(step)):
        assert result.tolist() == [2.0, 2.0]
