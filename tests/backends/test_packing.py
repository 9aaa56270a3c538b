"""Packing in the numpy backend: batched leaves of one dtype are reduced together.

Results must never depend on packing: every ``bytes_per_pack`` gives the same bits as
reducing each leaf alone, inputs stay untouched, and results stay read-only views.
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest
from asyncreplica_numpy import NumpyBackend
from asyncreplica_numpy._backend import group_by_size

import asyncreplica as ar
from asyncreplica._runtime._run import accepts_bytes_per_pack
from asyncreplica.abc import ReduceOp

N = 3
PACK_SIZES = [0, 1, 4, 8, 24, 100, 1000, 1 << 20]
OPS = [ReduceOp.SUM, ReduceOp.MEAN, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PROD]


def _leaves(replica: int) -> list[object]:
    """Mixed dtypes, shapes (0-d, 1-d, 2-d, non-contiguous) and Python numbers."""
    rng = np.random.default_rng(1234 + replica)
    grid = rng.standard_normal((6, 4)).astype(np.float32)
    return [
        rng.standard_normal(5).astype(np.float32),
        rng.integers(-50, 50, size=(2, 3)).astype(np.int32),
        np.float64(rng.standard_normal()),
        rng.standard_normal(7),
        grid[::2, 1:3],  # not contiguous
        np.array(rng.standard_normal(), dtype=np.float32),  # 0-d
        rng.standard_normal(3).astype(np.float16),
        (rng.standard_normal(4) + 1j * rng.standard_normal(4)).astype(np.complex64),
        np.array([np.nan, -0.0, np.inf], dtype=np.float32) * (replica + 1),
        float(replica) + 0.1,
        rng.integers(0, 9, size=4).astype(np.int64),
        rng.standard_normal((3, 1)).astype(np.float32),
    ]


def _reduce(op: ReduceOp, values: list[list[object]], bytes_per_pack: int) -> list[list[Any]]:
    backend = NumpyBackend([f"CPU:{r}" for r in range(len(values))])

    async def main() -> list[list[Any]]:
        return await backend.all_reduce(op, values, bytes_per_pack=bytes_per_pack)

    return anyio.run(main)


def _bits(result: list[Any]) -> list[tuple[str, tuple[int, ...], bytes]]:
    return [(a.dtype.str, a.shape, np.ascontiguousarray(a).tobytes()) for a in result]


def test_group_by_size_follows_tensorflow() -> None:
    assert group_by_size([], [], 4) == []
    assert group_by_size("abcd", [4, 4, 4, 4], 0) == [list("abcd")]
    # A pack closes only after it exceeds bytes_per_pack.
    assert group_by_size("abcd", [4, 4, 4, 4], 4) == [["a", "b"], ["c", "d"]]
    assert group_by_size("abcd", [4, 4, 4, 4], 8) == [["a", "b", "c"], ["d"]]
    assert group_by_size("abc", [10, 1, 1], 4) == [["a"], ["b", "c"]]
    assert group_by_size("abc", [1, 1, 1], 1) == [["a", "b"], ["c"]]


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.value)
def test_results_are_identical_for_every_bytes_per_pack(op: ReduceOp) -> None:
    values = [_leaves(r) for r in range(N)]
    # The reference: each leaf reduced alone (a one-leaf collective is never packed).
    alone = [_reduce(op, [[v[j]] for v in values], 0) for j in range(len(values[0]))]
    expected = [[alone[j][r][0] for j in range(len(alone))] for r in range(N)]
    for bytes_per_pack in PACK_SIZES:
        got = _reduce(op, values, bytes_per_pack)
        for r in range(N):
            assert _bits(got[r]) == _bits(expected[r]), (op, bytes_per_pack, r)


@pytest.mark.parametrize("bytes_per_pack", PACK_SIZES)
def test_packing_leaves_inputs_untouched_and_results_read_only(bytes_per_pack: int) -> None:
    values = [_leaves(r) for r in range(N)]
    before = [[np.array(leaf, copy=True) for leaf in v] for v in values]
    got = _reduce(ReduceOp.SUM, values, bytes_per_pack)
    for v, b in zip(values, before, strict=True):
        for leaf, copy in zip(v, b, strict=True):
            np.testing.assert_array_equal(np.asarray(leaf), copy)
    for j in range(len(values[0])):
        objects = {id(got[r][j]) for r in range(N)}
        assert len(objects) == N  # each replica its own view
        for r in range(N):
            assert isinstance(got[r][j], np.ndarray)
            assert not got[r][j].flags.writeable
            with pytest.raises(ValueError, match="read-only"):
                got[r][j][...] = 0


def test_sparse_and_large_leaves_are_not_packed_but_still_correct() -> None:
    big = [np.full(1 << 18, r + 1, dtype=np.float32) for r in range(N)]  # 1 MiB
    sparse = [
        ar.IndexedSlices(np.ones((1, 2)) * r, np.array([r]), dense_shape=(4, 2)) for r in range(N)
    ]
    values = [[big[r], np.ones(3) * r, sparse[r], np.ones(3) * 2 * r] for r in range(N)]
    got = _reduce(ReduceOp.SUM, values, 0)
    for r in range(N):
        np.testing.assert_array_equal(got[r][0], np.full(1 << 18, 6, dtype=np.float32))
        np.testing.assert_array_equal(got[r][1], np.full(3, 3.0))
        assert isinstance(got[r][2], ar.IndexedSlices)
        np.testing.assert_array_equal(got[r][2].indices, np.arange(N))
        np.testing.assert_array_equal(got[r][3], np.full(3, 6.0))


class _Recording(NumpyBackend):
    """Records the ``bytes_per_pack`` the runtime passes."""

    seen: list[int]

    async def all_reduce(
        self, op: ReduceOp, values: Any, *, bytes_per_pack: int = 0
    ) -> list[list[object]]:
        self.seen.append(bytes_per_pack)
        return await super().all_reduce(op, values, bytes_per_pack=bytes_per_pack)


class _Legacy(NumpyBackend):
    """A backend written before ``bytes_per_pack`` existed."""

    async def all_reduce(self, op: ReduceOp, values: Any) -> list[list[object]]:  # type: ignore[override]
        return await super().all_reduce(op, values)


async def _step_sum() -> object:
    ctx = ar.get_replica_context()
    assert ctx is not None
    a = await ctx.all_reduce("sum", [np.ones(2), np.ones(3, np.float32)])
    b = await ctx.all_reduce(
        "sum", [np.ones(2), np.ones(2)], ar.CommunicationOptions(bytes_per_pack=8)
    )
    return a, b


def test_runtime_passes_the_merged_bytes_per_pack() -> None:
    backend = _Recording(["CPU:0", "CPU:1"])
    backend.seen = []
    strategy = ar.MirroredStrategy(
        ["CPU:0", "CPU:1"],
        backend=backend,
        communication_options=ar.CommunicationOptions(bytes_per_pack=64),
    )
    assert accepts_bytes_per_pack(backend)
    anyio.run(strategy.run, _step_sum)
    assert backend.seen == [64, 8]


def test_a_backend_without_bytes_per_pack_is_still_called() -> None:
    backend = _Legacy(["CPU:0", "CPU:1"])
    assert not accepts_bytes_per_pack(backend)
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"], backend=backend)
    result = anyio.run(strategy.run, _step_sum)
    (a, b) = result
    np.testing.assert_array_equal(a[0].values[0], np.full(2, 2.0))
    np.testing.assert_array_equal(b[1].values[1], np.full(2, 2.0))
