"""The numpy backend's large-reduction path: threads, blocks, pooled buffers."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import anyio.lowlevel
import asyncreplica_numpy._backend as nb
import numpy as np
import pytest

import asyncreplica as ar

pytestmark = pytest.mark.anyio


@pytest.fixture
def small_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Take the large path for small arrays, so tests stay fast."""
    monkeypatch.setattr(nb, "POOL_BYTES", 1024)
    monkeypatch.setattr(nb, "OFFLOAD_BYTES", 4096)
    monkeypatch.setattr(nb, "BLOCK_BYTES", 256)
    monkeypatch.setattr(nb, "WORKERS", 3)


def _memory(result: Any) -> int:
    """Where the buffer a result shows starts: an int, as holding the buffer would pin it.

    A result's base chain ends in an object that is not an array (results cannot be made
    writable); the last array of the chain spans the whole buffer.
    """
    base = result
    while isinstance(base.base, np.ndarray):
        base = base.base
    return int(base.__array_interface__["data"][0])


def _inputs(n: int, size: int, dtype: type) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [(rng.standard_normal(size) * 1e3).astype(dtype) for _ in range(n)]


@pytest.mark.usefixtures("small_thresholds")
@pytest.mark.parametrize("op", list(ar.ReduceOp), ids=lambda op: op.value)
@pytest.mark.parametrize("size", [300, 5000], ids=["pooled", "offloaded"])
async def test_large_path_is_bitwise_the_small_path(op: ar.ReduceOp, size: int) -> None:
    backend = nb.NumpyBackend(["CPU:0", "CPU:1", "CPU:2"])
    inputs = _inputs(3, size, np.float32)
    copies = [a.copy() for a in inputs]
    result = await backend.all_reduce(op, [[a] for a in inputs])
    expected = nb._combine(op, copies)
    for views in result:
        assert views[0].tobytes() == expected.tobytes()
        assert not views[0].flags.writeable
    for a, c in zip(inputs, copies, strict=True):
        np.testing.assert_array_equal(a, c)
    await backend.aclose()


@pytest.mark.usefixtures("small_thresholds")
async def test_output_buffers_are_reused_only_when_no_replica_holds_a_view() -> None:
    backend = nb.NumpyBackend(["CPU:0", "CPU:1"])
    inputs = _inputs(2, 1000, np.float64)
    first = await backend.all_reduce(ar.ReduceOp.SUM, [[a] for a in inputs])
    kept = first[0][0]
    del first
    second = await backend.all_reduce(ar.ReduceOp.SUM, [[a] for a in inputs])
    assert _memory(second[0][0]) != _memory(kept)  # replica 0 still holds a view of the first
    np.testing.assert_array_equal(kept, second[0][0])
    second_buffer = _memory(second[0][0])
    del second
    third = await backend.all_reduce(ar.ReduceOp.SUM, [[a] for a in inputs])
    assert _memory(third[0][0]) == second_buffer  # nobody held the second buffer: reused
    await backend.aclose()


@pytest.mark.usefixtures("small_thresholds")
async def test_loop_keeps_running_during_an_offloaded_reduction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran_meanwhile = threading.Event()
    original = nb._blocked

    def waits_for_the_loop(*args: object) -> None:
        # The reduction can only finish if another coroutine runs while it is under way.
        assert ran_meanwhile.wait(timeout=30)
        original(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(nb, "_blocked", waits_for_the_loop)
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    inputs = ar.PerReplica(_inputs(2, 5000, np.float32))

    async def step(x: np.ndarray) -> object:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.all_reduce("sum", x)

    async def other() -> None:
        await anyio.lowlevel.checkpoint()
        ran_meanwhile.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)
        result = await strategy.run(step, args=(inputs,))
    a, b = strategy.experimental_local_results(result)
    np.testing.assert_array_equal(a, b)
