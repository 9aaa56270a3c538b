"""The three examples of TensorFlow's ReplicaContext page, made async.

Source: /work/shared/reference/seed_replica_context_ru.txt (tf.compat.v1.distribute.ReplicaContext).
TF uses ``MirroredStrategy(['GPU:0', 'GPU:1'])``; the numpy backend uses two CPU devices.
"""

from __future__ import annotations

import numpy as np
import pytest

import asyncreplica as ar

pytestmark = pytest.mark.anyio


@pytest.fixture
def strategy() -> ar.MirroredStrategy:
    return ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def test_replica_id_in_sync_group_per_replica(strategy: ar.MirroredStrategy) -> None:
    async def func():
        replica_context = ar.get_replica_context()
        return replica_context.replica_id_in_sync_group

    result = await strategy.run(func)

    assert isinstance(result, ar.PerReplica)
    assert result.values == (0, 1)
    assert repr(result) == "PerReplica:{\n  0: 0,\n  1: 1\n}"


@pytest.mark.parametrize(
    ("one", "dtype"),
    [
        pytest.param(1.0, np.float64, id="python-float"),
        pytest.param(np.float32(1.0), np.float32, id="float32"),
    ],
)
async def test_all_reduce_scalar_gives_two_on_each_replica(
    strategy: ar.MirroredStrategy, one: object, dtype: type
) -> None:
    async def step_fn():
        ctx = ar.get_replica_context()
        return await ctx.all_reduce(ar.ReduceOp.SUM, one)

    local = strategy.experimental_local_results(await strategy.run(step_fn))

    assert len(local) == 2
    for value in local:
        np.testing.assert_array_equal(value, 2.0)
        assert np.asarray(value).dtype == dtype


async def test_all_reduce_batched_list_gives_list_on_each_replica(
    strategy: ar.MirroredStrategy,
) -> None:
    async def step_fn():
        ctx = ar.get_replica_context()
        value1 = np.float32(1.0)
        value2 = np.float32(2.0)
        return await ctx.all_reduce(ar.ReduceOp.SUM, [value1, value2])

    local = strategy.experimental_local_results(await strategy.run(step_fn))

    assert len(local) == 2
    for replica_result in local:
        assert type(replica_result) is list
        assert len(replica_result) == 2
        np.testing.assert_array_equal(replica_result[0], np.float32(2.0))
        np.testing.assert_array_equal(replica_result[1], np.float32(4.0))
