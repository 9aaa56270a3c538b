"""Ways into the result every replica shares that an independent attack found (both passes).

An ndarray subclass's ``__array_finalize__`` saw the writable arrays the backend combined
into, and the Python pass's read-only owner handed out its own ``__array_interface__``
dict, so changing that dict made the next array of it writable.
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

import asyncreplica as ar


def _results(value_of: Any) -> tuple[Any, ...]:
    s = ar.MirroredStrategy(["CPU:0", "CPU:1"])

    async def step() -> object:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.all_reduce("sum", value_of(ctx.replica_id_in_sync_group))

    return s.experimental_local_results(anyio.run(s.run, step))


@pytest.mark.parametrize("batched", [False, True])
def test_a_subclass_input_never_sees_a_writable_alias_of_the_result(batched: bool) -> None:
    seen: list[np.ndarray] = []

    class Tracked(np.ndarray):
        def __array_finalize__(self, obj: object) -> None:
            seen.append(self)

    def value(r: int) -> object:
        x = (np.arange(3.0) + r).view(Tracked)
        return [x, x.copy()] if batched else x

    _, second = _results(value)
    shared = second[0] if batched else second
    np.testing.assert_array_equal(shared, [1.0, 3.0, 5.0])
    aliases = [a for a in seen if a.flags.writeable and np.shares_memory(a, shared)]
    assert not aliases, "a subclass kept a writable alias of the shared result"


def test_changing_a_handed_out_array_interface_changes_nothing() -> None:
    first, second = _results(lambda r: np.arange(4.0) + r)
    owner: Any = first
    while isinstance(owner, np.ndarray):  # the end of the base chain: the owner
        owner = owner.base
    interface = getattr(owner, "__array_interface__", None)
    if not isinstance(interface, dict):
        pytest.skip("the C pass's owner exports no array interface at all")
    interface["data"] = (interface["data"][0], False)  # ask for a writable array
    interface["shape"] = (1 << 20,)  # and past the end of the buffer
    again = np.asarray(owner)
    assert again.shape == first.shape
    with pytest.raises(ValueError, match="read-only"):
        again[0] = 42
    np.testing.assert_array_equal(second, [1.0, 3.0, 5.0, 7.0])
