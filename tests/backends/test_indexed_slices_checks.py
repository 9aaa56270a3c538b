"""``IndexedSlices`` that do not fit together are refused in the replica that built them.

Before: float indices from one replica silently turned every replica's indices into
float64, and rows that did not match ``dense_shape`` raised numpy's concatenation error
in whichever replica dispatched, with a note naming that (innocent) replica.
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

import asyncreplica as ar

GOOD = {"values": np.ones((2, 4), np.float32), "indices": np.array([1, 2]), "shape": (10, 4)}


def run_with(bad: dict[str, Any], bad_replica: int = 1) -> Any:
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        parts = {**GOOD, **bad} if ctx.replica_id_in_sync_group == bad_replica else GOOD
        slices = ar.IndexedSlices(parts["values"], parts["indices"], parts["shape"])
        return await ctx.all_reduce("sum", slices)

    async def main() -> Any:
        with anyio.fail_after(10):  # hang guard
            return await strategy.run(step)

    return strategy.experimental_local_results(anyio.run(main))


def test_float_indices_are_a_type_error_in_the_replica_that_passed_them() -> None:
    with pytest.raises(TypeError, match=r"indices must be integers.*float64") as info:
        run_with({"indices": np.array([1.0, 2.0])})
    assert "replica 1 of 3" in " ".join(getattr(info.value, "__notes__", []))


@pytest.mark.parametrize("bad_replica", [0, 1])
def test_rows_not_matching_dense_shape_name_the_right_replica(bad_replica: int) -> None:
    with pytest.raises(ValueError, match=r"shape \(2, 5\).*dense_shape \(10, 4\)") as info:
        run_with({"values": np.ones((2, 5), np.float32)}, bad_replica)
    assert f"replica {bad_replica} of 3" in " ".join(getattr(info.value, "__notes__", []))


def test_a_row_count_that_differs_from_the_index_count_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="3 rows of values but 2 indices"):
        run_with({"values": np.ones((3, 4), np.float32)})


def test_mixed_integer_index_dtypes_stay_integers() -> None:
    """int64 with uint64 is float64 in numpy; row numbers must stay integers."""
    results = run_with({"indices": np.array([3, 4], np.uint64)})
    for result in results:
        assert result.indices.dtype == np.int64
        np.testing.assert_array_equal(result.indices, [1, 2, 3, 4, 1, 2])
