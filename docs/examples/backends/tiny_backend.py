# A complete backend in about 120 lines: numpy arrays on CPU devices, no thread pool,
# no buffer reuse. It follows every rule of asyncreplica.abc.Backend and passes
# asyncreplica.testing.BackendConformanceTests (tests/docs/test_tiny_backend.py).
import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np

import asyncreplica as ar
from asyncreplica.abc import Backend, LeafSpec, ReduceOp, available_backends, register_backend

FOLD = {
    ReduceOp.SUM: np.add,
    ReduceOp.MEAN: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PROD: np.multiply,
}
LOCAL = {ReduceOp.SUM: np.sum, ReduceOp.MIN: np.min, ReduceOp.MAX: np.max, ReduceOp.PROD: np.prod}


def as_array(value: object) -> np.ndarray:
    """A leaf as a numpy array, or TypeError saying what is accepted."""
    if value is None or isinstance(value, str | bytes):
        raise TypeError(f"the tiny backend holds numbers and numpy arrays, got {value!r:.40}")
    array = np.asarray(value)
    if array.dtype.kind not in "iuf":
        raise TypeError(f"the tiny backend holds numbers and numpy arrays, got dtype {array.dtype}")
    return array


def divide(total: np.ndarray, count: int) -> np.ndarray:
    """MEAN's division: floats keep their dtype, the mean of integers is float64."""
    dtype = total.dtype if total.dtype.kind == "f" else np.float64
    return np.asarray(np.true_divide(total, count, dtype=dtype))


def exact_mean(totals: Sequence[np.ndarray], count: int) -> np.ndarray:
    """The mean of integers: summed in Python ints (no overflow), divided, rounded once."""
    total = np.asarray(sum(t.astype(object) for t in totals), dtype=object)
    return np.array([t / count for t in total.ravel().tolist()], np.float64).reshape(total.shape)


def combine(op: ReduceOp, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Combine left to right, in replica-id order, into a new array; MEAN divides by the count."""
    if op is ReduceOp.MEAN and arrays[0].dtype.kind in "iu":
        return exact_mean(arrays, len(arrays))
    out = np.array(arrays[0], copy=True)
    for a in arrays[1:]:
        out = np.asarray(FOLD[op](out, a))
    return divide(out, len(arrays)) if op is ReduceOp.MEAN else out


def shared(out: np.ndarray, n: int) -> list[np.ndarray]:
    """Freeze one result and give each of n replicas its own view of it."""
    out.flags.writeable = False
    return [out.view() for _ in range(n)]


def rows(per_leaf: list[list[Any]]) -> list[list[Any]]:
    """Turn per_leaf[j][r] into the contract's results[r][j]."""
    return [list(row) for row in zip(*per_leaf, strict=True)]


class TinyBackend(Backend):
    """numpy on CPU devices, written for reading rather than speed."""

    name = "tiny"

    def __init__(self, devices: Sequence[str]) -> None:
        super().__init__(devices)
        if any(not d.startswith("CPU:") for d in self.devices):
            raise ValueError(f"the tiny backend runs on CPU devices only, got {list(self.devices)}")
        self.calls = 0  # how many operations this backend computed

    def describe(self, value: object) -> LeafSpec:
        if isinstance(value, ar.IndexedSlices):
            values = as_array(value.values)
            as_array(value.indices)
            return LeafSpec(tuple(value.dense_shape), values.dtype.name, sparse=True)
        array = as_array(value)
        return LeafSpec(array.shape, array.dtype.name)

    async def all_reduce(self, op, values):
        self.calls += 1
        n, per_leaf = len(values), []
        for j in range(len(values[0])):
            leaves = [v[j] for v in values]
            if isinstance(leaves[0], ar.IndexedSlices):  # concatenate the slices
                joined = np.concatenate([as_array(s.values) for s in leaves])
                if op is ReduceOp.MEAN:
                    joined = divide(joined, n)
                index = np.concatenate([as_array(s.indices) for s in leaves])
                pairs = zip(shared(joined, n), shared(index, n), strict=True)
                per_leaf.append([ar.IndexedSlices(v, i, leaves[0].dense_shape) for v, i in pairs])
            else:
                per_leaf.append(shared(combine(op, [as_array(x) for x in leaves]), n))
        return rows(per_leaf)

    async def all_gather(self, values, axis):
        self.calls += 1
        n = len(values)
        return rows(
            [
                shared(np.concatenate([as_array(v[j]) for v in values], axis=axis), n)
                for j in range(len(values[0]))
            ]
        )

    async def reduce_scatter(self, op, values, axis):
        self.calls += 1
        n, per_leaf = len(values), []
        for j in range(len(values[0])):
            reduced = combine(op, [as_array(v[j]) for v in values])
            reduced.flags.writeable = False  # the chunks are read-only views of one buffer
            per_leaf.append(np.split(reduced, n, axis=axis))
        return rows(per_leaf)

    async def broadcast(self, values, num_replicas):
        self.calls += 1
        return rows([shared(np.array(as_array(v), copy=True), num_replicas) for v in values])

    async def reduce(self, op, components, axis):
        self.calls += 1
        arrays = [as_array(c) for c in components]
        if axis is None:
            return combine(op, arrays)
        if op is ReduceOp.MEAN:  # global sum over global count: uneven components weigh right
            count = sum(int(np.prod([a.shape[k] for k in axis])) for a in arrays)
            if arrays[0].dtype.kind in "iu":
                return exact_mean(
                    [np.asarray(a.astype(object).sum(axis=axis)) for a in arrays], count
                )
            total = combine(ReduceOp.SUM, [np.asarray(a.sum(axis=axis)) for a in arrays])
            return divide(total, count)
        return combine(op, [np.asarray(LOCAL[op](a, axis=axis)) for a in arrays])

    async def gather(self, components, axis):
        self.calls += 1
        return np.concatenate([as_array(c) for c in components], axis=axis)


# Register it under the name users pass as backend=. An installed package would declare an
# entry point in the group "asyncreplica.backends" instead.
register_backend("tiny", TinyBackend, replace=True)
assert "tiny" in available_backends()

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"], backend="tiny")
assert isinstance(strategy.backend, TinyBackend)


async def step(x):
    ctx = ar.get_replica_context()
    r = ctx.replica_id_in_sync_group
    total = await ctx.all_reduce(ar.ReduceOp.SUM, x * (r + 1))  # 1 + 2 + 3
    rows_seen = await ctx.all_gather(np.full((1, 2), r, dtype=np.int64), axis=0)
    return total, rows_seen


async def main():
    total, seen = await strategy.run(step, args=(np.float32(1.0),))
    for t, s in zip(
        strategy.experimental_local_results(total),
        strategy.experimental_local_results(seen),
        strict=True,
    ):
        assert t == 6.0
        assert t.dtype == np.float32
        assert not t.flags.writeable  # a shared result is read-only
        assert s.tolist() == [[0, 0], [1, 1], [2, 2]]
    mean = await strategy.reduce("mean", total, axis=None)
    assert mean == 6.0
    assert strategy.backend.calls == 3  # all_reduce, all_gather, reduce


asyncio.run(main())
print("the tiny backend ran a step on", strategy.num_replicas_in_sync, "replicas")
