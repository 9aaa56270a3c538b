"""Collectives the runtime issues for the user (``extended.update``'s merge_call) carry the
user's call site: the walk passes the runtime's own coroutines and stops at the driver.

Before, the walk stopped at the first runtime coroutine, so such collectives had no call
site: two of them on different lines paired silently (and, once frameless call sites were
warned about, the warning escaped as an internal error).
"""

from __future__ import annotations

import warnings

import anyio
import numpy as np
import pytest

import asyncreplica as ar

pytestmark = pytest.mark.anyio


def _strategy() -> ar.MirroredStrategy:
    return ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def test_update_from_one_line_runs_without_a_warning() -> None:
    s = _strategy()
    var = ar.Mirrored([np.array([1.0, 2.0], np.float32)] * 2)

    async def step(x: object) -> object:
        return await s.extended.update(var, lambda v, d: v + d, args=(x,), group=True)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = await s.run(step, args=(ar.PerReplica((np.float32(1), np.float32(2))),))
    first, second = s.experimental_local_results(result)
    np.testing.assert_array_equal(first, [2.0, 3.0])  # each component plus its replica's x
    np.testing.assert_array_equal(second, [3.0, 4.0])


async def test_update_from_two_lines_is_a_call_site_mismatch() -> None:
    s = _strategy()
    var = ar.Mirrored([np.array([1.0, 2.0], np.float32)] * 2)

    def add(v: object, d: object) -> object:  # one fn: two lambdas would differ too (C14)
        return v + d  # type: ignore[operator]

    async def step(x: object) -> object:
        if ar.get_replica_context().replica_id_in_sync_group == 0:  # type: ignore[union-attr]
            return await s.extended.update(var, add, args=(x,))  # line A
        return await s.extended.update(var, add, args=(x,))  # line B

    with pytest.raises(ar.CollectiveMismatchError) as info:
        await s.run(step, args=(np.float32(1),))
    assert info.value.fields == ("call site",)
    text = str(info.value)
    assert "test_library_issued_call_sites.py" in text, text
    await anyio.lowlevel.checkpoint()
