"""The numpy backend's batch path: a batched all_reduce of leaves of one dtype.

The runtime describes each replica's leaves (``describe_leaves``) before the
collective; the batch path takes the dtype and shapes it found and packs, combines and
views the leaves without looking at them again. Its results must be those of reducing
each leaf alone, bit for bit, whatever the replicas passed (byte-swapped, strided,
numpy scalars, Python numbers) and whether or not the runtime described the leaves.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import pytest
from asyncreplica_numpy import NumpyBackend

import asyncreplica as ar
from asyncreplica.abc import ReduceOp

OPS = [ReduceOp.SUM, ReduceOp.MEAN, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PROD]


def _reduce(
    op: ReduceOp, values: list[list[Any]], bytes_per_pack: int = 0, *, describe: bool = False
) -> list[list[Any]]:
    backend = NumpyBackend([f"CPU:{r}" for r in range(len(values))])
    if describe:  # as the runtime does before the collective
        for row in values:
            backend.describe_leaves(row)

    async def main() -> list[list[Any]]:
        return await backend.all_reduce(op, values, bytes_per_pack=bytes_per_pack)

    return anyio.run(main)


def _alone(op: ReduceOp, values: list[list[Any]]) -> list[list[Any]]:
    """Each leaf reduced alone (a one-leaf collective never takes the batch path)."""
    per_leaf = [_reduce(op, [[row[j]] for row in values]) for j in range(len(values[0]))]
    return [[per_leaf[j][r][0] for j in range(len(per_leaf))] for r in range(len(values))]


def _bits(result: list[Any]) -> list[tuple[str, tuple[int, ...], bytes]]:
    return [(a.dtype.str, a.shape, np.ascontiguousarray(a).tobytes()) for a in result]


def _batch(dtype: str, shapes: list[tuple[int, ...]], replicas: int) -> list[list[Any]]:
    rng = np.random.default_rng(7)
    rows = []
    for _ in range(replicas):
        if np.dtype(dtype).kind in "iu":
            info = np.iinfo(dtype)
            rows.append([rng.integers(info.min, info.max, s, dtype=dtype) for s in shapes])
        else:
            rows.append([(rng.standard_normal(s) * 3).astype(dtype) for s in shapes])
    return rows


SHAPES = {
    "one 1-d shape": [(16,)] * 40,
    "one 2-d shape": [(3, 4)] * 30,
    "0-d": [()] * 25,
    "mixed shapes, an empty leaf": [(5,), (2, 3), (), (0,), (7,), (1, 1, 2)] * 5,
}


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.value)
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "complex64", "int8", "uint32"])
@pytest.mark.parametrize("shapes", list(SHAPES.values()), ids=list(SHAPES))
@pytest.mark.parametrize("describe", [True, False], ids=["described", "not described"])
def test_batch_equals_each_leaf_alone_bit_for_bit(
    op: ReduceOp, dtype: str, shapes: list[tuple[int, ...]], describe: bool
) -> None:
    values = _batch(dtype, shapes, 5)
    expected = _alone(op, values)
    for bytes_per_pack in (0, 64):
        got = _reduce(op, values, bytes_per_pack, describe=describe)
        for r in range(len(values)):
            assert _bits(got[r]) == _bits(expected[r]), (bytes_per_pack, r)


def test_integer_mean_of_a_batch_is_exact() -> None:
    # int8: 100 + 100 wraps in int8; uint32: the sum exceeds 2**32.
    small = [[np.full(4, 100, np.int8)] * 3 for _ in range(3)]
    big = [[np.full(2, 2**32 - 1 - r, np.uint32)] * 2 for r in range(3)]
    for values, mean in ((small, 100.0), (big, 2**32 - 2.0)):
        for row in _reduce(ReduceOp.MEAN, values, describe=True):
            for leaf in row:
                assert leaf.dtype == np.float64
                np.testing.assert_array_equal(leaf, np.full(leaf.shape, mean))


def _odd_rows() -> dict[str, Callable[[list[Any]], list[Any]]]:
    """Ways another replica may pass leaves of the same specs as replica 0's."""
    return {
        "byte-swapped": lambda row: [a.astype(a.dtype.newbyteorder()) for a in row],
        "not contiguous": lambda row: [np.repeat(a, 2)[::2] for a in row],
        "numpy scalars": lambda row: [a[()] for a in row],
        "Python numbers": lambda row: [float(a) for a in row],
    }


@pytest.mark.parametrize("odd", list(_odd_rows()), ids=list(_odd_rows()))
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.MEAN], ids=lambda o: o.value)
def test_other_replicas_may_pass_any_leaves_of_the_same_specs(odd: str, op: ReduceOp) -> None:
    values = _batch(
        "float64", [()] * 6 if odd in ("numpy scalars", "Python numbers") else [(8,)] * 6, 3
    )
    values[1] = _odd_rows()[odd](values[1])
    expected = _alone(op, values)
    got = _reduce(op, values, describe=True)
    for r in range(len(values)):
        np.testing.assert_array_equal(np.asarray(got[r]), np.asarray(expected[r]))
        assert [a.shape for a in got[r]] == [a.shape for a in expected[r]]


def test_results_are_read_only_views_each_replica_owns_and_inputs_are_untouched() -> None:
    values = _batch("float32", [(4, 2)] * 20, 4)
    before = [[a.copy() for a in row] for row in values]
    got = _reduce(ReduceOp.SUM, values, describe=True)
    for row, copy in zip(values, before, strict=True):
        for leaf, saved in zip(row, copy, strict=True):
            np.testing.assert_array_equal(leaf, saved)
    assert len({id(leaf) for row in got for leaf in row}) == 4 * 20
    for row in got:
        for leaf in row:
            assert not leaf.flags.writeable
            with pytest.raises(ValueError, match="WRITEABLE"):
                leaf.flags.writeable = True
            with pytest.raises(ValueError, match="read-only"):
                leaf[...] = 0


def _python_calls(work: Callable[[], object]) -> int:
    """How many Python-level and builtin calls ``work()`` makes."""
    calls = 0

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    sys.setprofile(count)
    try:
        work()
    finally:
        sys.setprofile(None)
    return calls


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.value)
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_a_batch_costs_no_python_call_per_leaf(op: ReduceOp, dtype: str) -> None:
    """Describing and reducing 1000 leaves makes as many Python calls as 10 leaves."""

    def calls(m: int) -> int:
        values = _batch(dtype, [(4,)] * m, 3)
        backend = NumpyBackend(["CPU:0", "CPU:1", "CPU:2"])
        for row in values:  # warm the spec cache: the first batch of a shape is slow
            backend.describe_leaves(row)

        async def main() -> None:
            await backend.all_reduce(op, values)

        anyio.run(main)

        def one_round() -> None:
            for row in values:
                backend.describe_leaves(row)
            anyio.run(main)

        return _python_calls(one_round)

    assert calls(1000) - calls(10) < 20


COLLECTIVES: dict[str, Callable[[Any, Any], Any]] = {
    "all_reduce": lambda ctx, xs: ctx.all_reduce("sum", xs),
    "all_gather": lambda ctx, xs: ctx.all_gather(xs, axis=0),
    "broadcast": lambda ctx, xs: ctx.broadcast(xs, source=0),
    "reduce_scatter": lambda ctx, xs: ctx.reduce_scatter("sum", xs, axis=0),
}


@pytest.mark.parametrize("kind", list(COLLECTIVES))
def test_nothing_kept_from_describing_a_batch_outlives_its_collective(kind: str) -> None:
    n = 2
    strategy = ar.MirroredStrategy([f"CPU:{r}" for r in range(n)])
    backend = strategy.backend
    assert isinstance(backend, NumpyBackend)
    batch = ar.PerReplica([[np.ones(4, np.float32)] * 3 for _ in range(n)])

    async def step(xs: list[np.ndarray[Any, Any]]) -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        await COLLECTIVES[kind](ctx, xs)

    anyio.run(lambda: strategy.run(step, args=(batch,)))
    assert not backend._layouts  # it holds the replicas' leaves


def test_describes_that_no_collective_follows_keep_a_bounded_store() -> None:
    """As when the ledger raises a mismatch: the describes' leaves are not all kept."""
    backend = NumpyBackend(["CPU:0", "CPU:1"])
    rows = [[np.ones(3)] * 2 for _ in range(10 * backend._max_layouts)]
    for row in rows:
        backend.describe_leaves(row)
    assert 0 < len(backend._layouts) <= backend._max_layouts
