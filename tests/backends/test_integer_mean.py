"""MEAN of integers never overflows: the exact sum, divided, rounded once to float64.

Through ``MirroredStrategy`` on the numpy backend, on every path a collective can take:
one leaf, a batch (packed whole or by ``bytes_per_pack``), a large leaf, reduce_scatter.
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

import asyncreplica as ar


def exact_mean(values: list[Any]) -> np.ndarray:
    """The float64 nearest the true mean (Python ints never overflow; int / int rounds once)."""
    arrays = [np.asarray(v).astype(object) for v in values]
    total = np.asarray(sum(arrays[1:], arrays[0]), dtype=object)
    n = len(values)
    return np.array([t / n for t in total.ravel().tolist()], np.float64).reshape(total.shape)


def run(n: int, fn: Any, per_replica: list[Any], **kwargs: Any) -> tuple[Any, ...]:
    strategy = ar.MirroredStrategy([f"CPU:{i}" for i in range(n)], **kwargs)

    async def main() -> Any:
        with anyio.fail_after(30):  # hang guard
            return await strategy.run(fn, args=(ar.PerReplica(per_replica),))

    return strategy.experimental_local_results(anyio.run(main))


async def mean(x: Any) -> Any:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return await ctx.all_reduce("mean", x)


def test_int8_mean_of_100_on_two_replicas_is_100() -> None:
    """The issue's example: int8 100 on 2 replicas gave -28.0."""
    got = run(2, mean, [np.int8(100), np.int8(100)])
    assert [float(g) for g in got] == [100.0, 100.0]
    assert all(np.asarray(g).dtype == np.float64 for g in got)


def test_int64_mean_near_2_to_62_stays_positive_and_exact() -> None:
    """The issue's other example: int64 near 2**62 went negative."""
    values = [np.array([2**62 + 1, 2**63 - 1], np.int64)] * 3
    got = run(3, mean, values)
    for g in got:
        np.testing.assert_array_equal(g, exact_mean(values), strict=True)
    assert float(got[0][0]) == (3 * (2**62 + 1)) / 3


@pytest.mark.parametrize("bytes_per_pack", [0, 1, 16], ids=["one-pack", "pack-per-leaf", "packs"])
@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint16", "uint64"])
def test_a_batch_of_integer_leaves_is_averaged_exactly(dtype: str, bytes_per_pack: int) -> None:
    info = np.iinfo(dtype)
    per_replica = [
        [np.array([info.max - r, info.min + r, 3], dtype), np.array([info.max, r], dtype)]
        for r in range(3)
    ]
    options = ar.CommunicationOptions(bytes_per_pack=bytes_per_pack)
    got = run(3, mean, per_replica, communication_options=options)
    for result in got:
        for j in range(2):
            expected = exact_mean([per_replica[r][j] for r in range(3)])
            np.testing.assert_array_equal(result[j], expected, strict=True)


def test_a_large_integer_leaf_is_averaged_exactly() -> None:
    """Past the backend's pooled size (1 MiB) the large-value path takes the mean too."""
    values = [np.full(1 << 18, 2**62 + r, np.int64) for r in range(2)]
    got = run(2, mean, values)
    np.testing.assert_array_equal(got[0], exact_mean(values), strict=True)
    assert got[0][0] > 0


def test_reduce_scatter_mean_of_integers_is_exact() -> None:
    async def scatter(x: Any) -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.reduce_scatter("mean", x, axis=0)

    values = [np.array([100, 120, -128, 127], np.int8), np.array([100, 120, -128, 127], np.int8)]
    got = run(2, scatter, values)
    np.testing.assert_array_equal(got[0], np.array([100.0, 120.0]), strict=True)
    np.testing.assert_array_equal(got[1], np.array([-128.0, 127.0]), strict=True)
