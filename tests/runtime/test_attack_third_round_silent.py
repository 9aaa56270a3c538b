"""Silent results found by the third attack (issue 23): each test failed before its fix.

B11 (listed as B12 in the brief): a step written as a generator function ran nothing.
B9: IndexedSlices indices that do not fit the common index dtype, or outside dense_shape.
B1: a backend's results that do not match the collective's signature.
B0c: a replica's helper task started in a fresh contextvars.Context().
B7: a collective driven by hand and abandoned after it was issued.
"""

from __future__ import annotations

from typing import Any

import pytest

import asyncreplica as ar

pytestmark = pytest.mark.anyio

DEVICES = ["CPU:0", "CPU:1", "CPU:2"]


def strategy(n: int = 2, **kwargs: Any) -> ar.MirroredStrategy:
    return ar.MirroredStrategy(DEVICES[:n], **kwargs)


def _ctx() -> ar.ReplicaContext:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return ctx


# -- B11: a generator function as the step -------------------------------------------------


async def test_an_async_generator_step_is_refused() -> None:
    async def step() -> Any:
        yield await _ctx().all_reduce("SUM", 1.0)

    with pytest.raises(TypeError, match=r"(?s)step is an async generator function.*`return`"):
        await strategy().run(step)


async def test_a_generator_step_is_refused() -> None:
    def step() -> Any:
        yield 1.0

    with pytest.raises(TypeError, match=r"(?s)step is a generator function.*`return`"):
        await strategy().run(step)
