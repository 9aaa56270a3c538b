"""Shared read-only results keep dtypes that ``__array_interface__`` cannot spell.

ml_dtypes' bfloat16 reads back through an array interface as void (``|V2``): a result
made read-only that way came back as raw bytes. Found when the TF golden cases met the
read-only results.
"""

from __future__ import annotations

import anyio
import numpy as np
import pytest

import asyncreplica as ar

ml_dtypes = pytest.importorskip("ml_dtypes")


@pytest.mark.parametrize("collective", ["all_reduce", "all_gather", "broadcast", "batch"])
def test_bfloat16_results_are_bfloat16_and_read_only(collective: str) -> None:
    s = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    bf16 = np.dtype(ml_dtypes.bfloat16)

    async def step() -> object:
        ctx = ar.get_replica_context()
        assert ctx is not None
        x = (np.arange(4).reshape(2, 2) + ctx.replica_id_in_sync_group).astype(bf16)
        if collective == "all_reduce":
            return await ctx.all_reduce("sum", x)
        if collective == "all_gather":
            return await ctx.all_gather(x, 0)
        if collective == "broadcast":
            return await ctx.broadcast(x)
        return (await ctx.all_reduce("sum", [x, x]))[1]

    for result in s.experimental_local_results(anyio.run(s.run, step)):
        assert result.dtype == bf16, result.dtype
        with pytest.raises(ValueError, match="WRITEABLE"):
            result.setflags(write=True)
        base = result.base
        while base is not None and isinstance(base, np.ndarray):
            with pytest.raises(ValueError, match="WRITEABLE"):
                base.setflags(write=True)
            base = base.base
    if collective == "all_reduce":
        np.testing.assert_array_equal(result.astype(np.float32), [[1, 3], [5, 7]])
