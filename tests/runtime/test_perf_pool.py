"""Pooled outputs of all_gather, broadcast and reduce_scatter: reused only once no replica views them.

Counts and identities only, never timings (docs/performance.md has the speed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import asyncreplica_numpy._backend as nb
import numpy as np
import pytest

import asyncreplica as ar

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def small_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pool outputs of 1 KiB and more, so the tests stay small."""
    monkeypatch.setattr(nb, "POOL_BYTES", 1024)
    monkeypatch.setattr(nb, "OFFLOAD_BYTES", 1 << 30)


def _memory(result: Any) -> int:
    """Where the buffer a result shows starts: an int, as holding the buffer would pin it.

    A result's base chain ends in an object that is not an array (results cannot be made
    writable); the last array of the chain spans the whole buffer.
    """
    base = result
    while isinstance(base.base, np.ndarray):
        base = base.base
    return int(base.__array_interface__["data"][0])


def _inputs(n: int, size: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(size) for _ in range(n)]


@pytest.mark.usefixtures("small_pool")
async def test_broadcast_reuses_its_output_only_when_no_replica_holds_a_view() -> None:
    backend = nb.NumpyBackend(["CPU:0", "CPU:1", "CPU:2"])
    source = _inputs(1, 1000)[0]
    first = await backend.broadcast([source], 3)
    kept = first[1][0]
    del first
    second = await backend.broadcast([source * 2], 3)
    assert _memory(second[0][0]) != _memory(kept)  # replica 1 still holds a view of the first
    np.testing.assert_array_equal(kept, source)  # and it still reads the first result
    second_buffer = _memory(second[0][0])
    for views in second:
        np.testing.assert_array_equal(views[0], source * 2)
        assert not views[0].flags.writeable
    del second, views
    third = await backend.broadcast([source * 3], 3)
    assert _memory(third[2][0]) == second_buffer  # nobody held the second buffer: reused
    np.testing.assert_array_equal(third[2][0], source * 3)
    np.testing.assert_array_equal(source, _inputs(1, 1000)[0])  # the input is untouched
    await backend.aclose()


@pytest.mark.usefixtures("small_pool")
@pytest.mark.parametrize("op", list(ar.ReduceOp), ids=lambda op: op.value)
async def test_pooled_reduce_scatter_is_bitwise_the_small_path(op: ar.ReduceOp) -> None:
    inputs = _inputs(4, 1200).copy()
    backend = nb.NumpyBackend(["CPU:0", "CPU:1", "CPU:2", "CPU:3"])
    result = await backend.reduce_scatter(op, [[a] for a in inputs], 0)
    expected = np.split(nb._combine(op, list(inputs)), 4)
    for r, views in enumerate(result):
        assert views[0].tobytes() == expected[r].tobytes()
        assert not views[0].flags.writeable
    await backend.aclose()


@pytest.mark.usefixtures("small_pool")
async def test_reduce_scatter_reuses_its_output_only_when_no_chunk_is_held() -> None:
    backend = nb.NumpyBackend(["CPU:0", "CPU:1"])
    inputs = _inputs(2, 1000)
    first = await backend.reduce_scatter(ar.ReduceOp.SUM, [[a] for a in inputs], 0)
    kept = first[1][0]  # replica 1's chunk keeps the whole buffer alive
    before = kept.copy()
    del first
    second = await backend.reduce_scatter(ar.ReduceOp.SUM, [[a * 2] for a in inputs], 0)
    assert _memory(second[0][0]) != _memory(kept)
    np.testing.assert_array_equal(kept, before)  # the held chunk was not overwritten
    second_buffer = _memory(second[0][0])
    del second
    third = await backend.reduce_scatter(ar.ReduceOp.SUM, [[a] for a in inputs], 0)
    assert _memory(third[0][0]) == second_buffer
    np.testing.assert_array_equal(third[1][0], before)
    await backend.aclose()


async def test_strategy_broadcast_and_reduce_scatter_results_stay_valid_across_steps(
    small_pool: None,
) -> None:
    # Through the strategy: each step's results are held while the next step runs.
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    held: list[tuple[np.ndarray, np.ndarray, float]] = []

    async def step(x: np.ndarray) -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        for i in range(4):
            b = await ctx.broadcast(x + i, source=1)
            s = await ctx.reduce_scatter(ar.ReduceOp.SUM, x + i, axis=0)
            if ctx.replica_id_in_sync_group == 0:
                held.append((b, s, float(i)))

    values = ar.PerReplica([np.full(512, float(r)) for r in range(2)])
    await strategy.run(step, args=(values,))
    for b, s, i in held:
        np.testing.assert_array_equal(b, np.full(512, 1.0 + i))
        np.testing.assert_array_equal(s, np.full(256, 1.0 + 2 * i))


@pytest.mark.usefixtures("small_pool")
@pytest.mark.parametrize(
    ("shapes", "axis"),
    [
        pytest.param([(300,), (300,), (300,)], 0, id="even-1d"),
        pytest.param([(40, 5), (10, 5), (25, 5)], 0, id="uneven-axis0"),
        pytest.param([(6, 40), (6, 10), (6, 25)], 1, id="uneven-axis1"),
    ],
)
async def test_pooled_all_gather_is_the_concatenation_and_reuses_only_free_buffers(
    shapes: list[tuple[int, ...]], axis: int
) -> None:
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(shape) for shape in shapes]
    copies = [a.copy() for a in inputs]
    backend = nb.NumpyBackend(["CPU:0", "CPU:1", "CPU:2"])
    expected = np.concatenate(inputs, axis=axis)
    first = await backend.all_gather([[a] for a in inputs], axis)
    for views in first:
        assert views[0].tobytes() == expected.tobytes()
        assert not views[0].flags.writeable
    kept = first[2][0]
    del first, views
    second = await backend.all_gather([[a * 2] for a in inputs], axis)
    assert _memory(second[0][0]) != _memory(kept)  # replica 2 still holds the first result
    assert kept.tobytes() == expected.tobytes()  # and it was not overwritten
    second_buffer = _memory(second[0][0])
    del second
    third = await backend.all_gather([[a * 3] for a in inputs], axis)
    assert _memory(third[1][0]) == second_buffer  # nobody held the second buffer: reused
    np.testing.assert_array_equal(third[1][0], np.concatenate(inputs, axis=axis) * 3)
    for a, c in zip(inputs, copies, strict=True):
        np.testing.assert_array_equal(a, c)  # inputs untouched
    await backend.aclose()


async def test_a_large_all_gather_copies_off_the_event_loop_and_reuses_its_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(nb, "POOL_BYTES", 1024)
    monkeypatch.setattr(nb, "OFFLOAD_BYTES", 1024)
    calls: list[object] = []
    real = nb.anyio.to_thread.run_sync

    async def spy(fn: object, *args: object, **kwargs: object) -> object:
        calls.append(fn)
        return await real(fn, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(nb.anyio.to_thread, "run_sync", spy)
    backend = nb.NumpyBackend(["CPU:0", "CPU:1"])
    inputs = _inputs(2, 1000)
    result = await backend.all_gather([[a] for a in inputs], 0)
    assert len(calls) == 1
    np.testing.assert_array_equal(result[1][0], np.concatenate(inputs))
    buffer = _memory(result[0][0])
    del result
    # The worker thread keeps no reference to the output: the next call reuses it.
    again = await backend.all_gather([[a] for a in inputs], 0)
    assert _memory(again[0][0]) == buffer
    await backend.aclose()


def _run_on(loop: str, main: Callable[[], Awaitable[None]]) -> None:
    if loop == "asyncio":
        asyncio.run(main())
    elif loop == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        uvloop.run(main())
    else:
        trio = pytest.importorskip("trio")
        trio.run(main)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop", "trio"])
@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "broadcast", "reduce_scatter"])
def test_a_loop_that_drops_its_results_writes_one_buffer_every_step(
    monkeypatch: pytest.MonkeyPatch, kind: str, loop: str
) -> None:
    # The replica that dispatches step i+1 was woken by a loop callback that still
    # held its step-i result; without a turn of the loop before taking a buffer, the
    # pool alternated between two large buffers (twice the memory).
    monkeypatch.setattr(nb, "POOL_BYTES", 1024)
    monkeypatch.setattr(nb, "OFFLOAD_BYTES", 2048)
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2", "CPU:3"])
    inputs = _inputs(4, 1024)  # 8 KiB per replica: every output is pooled and waits a turn
    buffers: list[set[int]] = [set() for _ in range(4)]
    steps = 8

    async def step(x: np.ndarray) -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        mine = buffers[ctx.replica_id_in_sync_group]
        for _ in range(steps):
            if kind == "all_reduce":
                result = await ctx.all_reduce(ar.ReduceOp.SUM, x)
            elif kind == "all_gather":
                result = await ctx.all_gather(x, axis=0)
            elif kind == "broadcast":
                result = await ctx.broadcast(x)
            else:
                result = await ctx.reduce_scatter(ar.ReduceOp.SUM, x, axis=0)
            mine.add(_memory(result))
            del result

    async def main() -> None:
        await strategy.run(step, args=(ar.PerReplica(inputs),))

    _run_on(loop, main)
    assert [len(ids) for ids in buffers] == [1, 1, 1, 1]
    assert len(set.union(*buffers)) == 1


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_a_held_result_is_never_overwritten_by_the_next_step(
    monkeypatch: pytest.MonkeyPatch, loop: str
) -> None:
    monkeypatch.setattr(nb, "POOL_BYTES", 1024)
    monkeypatch.setattr(nb, "OFFLOAD_BYTES", 2048)
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    held: list[tuple[float, np.ndarray]] = []

    async def step(x: np.ndarray) -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        for i in range(6):
            result = await ctx.all_reduce(ar.ReduceOp.SUM, x + i)
            if ctx.replica_id_in_sync_group == i % 2:
                held.append((float(i), result))  # kept by one replica only

    async def main() -> None:
        values = ar.PerReplica([np.full(1024, float(r)) for r in range(2)])
        await strategy.run(step, args=(values,))

    _run_on(loop, main)
    assert len(held) == 6
    for i, result in held:
        np.testing.assert_array_equal(result, np.full(1024, 1.0 + 2 * i))
