"""A replica's batch is a read-only view of the dataset: a write raises, the data stays.

Found by an independent attack: the batches were writable views of the user's arrays, so
``x[...] = ...`` in a step rewrote the dataset, and the next epoch saw the changed data.
"""

from __future__ import annotations

import anyio
import numpy as np
import pytest

import asyncreplica as ar


@pytest.mark.parametrize("n", [1, 2])
def test_writing_into_a_batch_raises_and_leaves_the_dataset_alone(n: int) -> None:
    s = ar.MirroredStrategy([f"CPU:{i}" for i in range(n)])
    data = [{"x": np.arange(8.0).reshape(4, 2), "y": np.arange(4)}]
    before = {k: v.copy() for k, v in data[0].items()}

    async def step(batch: dict[str, np.ndarray]) -> int:
        with pytest.raises(ValueError, match="read-only"):
            batch["x"][...] = 100.0
        ctx = ar.get_replica_context()
        assert ctx is not None
        return ctx.replica_id_in_sync_group

    for epoch in range(2):
        for batch in s.experimental_distribute_dataset(data):
            results = s.experimental_local_results(anyio.run(s.run, step, (batch,)))
            assert results == tuple(range(n)), epoch  # every replica's write was refused
    for key, value in data[0].items():
        np.testing.assert_array_equal(value, before[key])
        assert value.flags.writeable  # the user's own arrays are untouched
