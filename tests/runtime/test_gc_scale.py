"""The generation-0 threshold scaled to the runs in progress (asyncreplica/_runtime/_gc.py).

Every test runs on asyncio, uvloop and trio; the threshold is read inside the
replicas, so the order of events is fixed by the test's own events, not by timing.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import anyio
import pytest

import asyncreplica as ar
from asyncreplica._runtime import _gc

pytestmark = pytest.mark.anyio

DEFAULT = 700


@pytest.fixture(autouse=True)
def _known_threshold() -> Iterator[None]:
    before = gc.get_threshold()
    gc.set_threshold(DEFAULT, *before[1:])
    yield
    gc.set_threshold(*before)


def _strategy(n: int) -> ar.MirroredStrategy:
    return ar.MirroredStrategy([f"CPU:{i}" for i in range(n)])


def _gen0() -> int:
    return gc.get_threshold()[0]


async def test_raised_in_proportion_to_the_replicas_during_a_run_and_restored_after() -> None:
    seen: list[int] = []

    async def step() -> None:
        seen.append(_gen0())

    await _strategy(20).run(step)
    assert seen == [20 * _gc.PER_REPLICA] * 20
    assert _gen0() == DEFAULT


async def test_never_lowered_below_the_threshold_in_place() -> None:
    seen: list[int] = []
    gc.set_threshold(5000)

    async def step() -> None:
        seen.append(_gen0())

    await _strategy(2).run(step)
    assert set(seen) == {5000}
    assert _gen0() == 5000


async def test_restored_after_a_replica_raises() -> None:
    async def step() -> None:
        assert _gen0() == 20 * _gc.PER_REPLICA
        raise KeyError("boom")

    with pytest.raises((KeyError, ExceptionGroup)):
        await _strategy(20).run(step)
    assert _gen0() == DEFAULT


async def test_restored_after_the_run_is_cancelled() -> None:
    waiting = anyio.Event()
    seen: list[int] = []

    async def step() -> None:
        seen.append(_gen0())
        if len(seen) == 20:
            waiting.set()
        await anyio.sleep_forever()

    async with anyio.create_task_group() as tg:
        tg.start_soon(_strategy(20).run, step)
        await waiting.wait()
        assert _gen0() == 20 * _gc.PER_REPLICA
        tg.cancel_scope.cancel()
    assert seen == [20 * _gc.PER_REPLICA] * 20
    assert _gen0() == DEFAULT


async def test_concurrent_runs_share_one_count_and_restore_once() -> None:
    # A run of 20 replicas and one of 10 overlap: while both run the threshold is the
    # larger run's; when the larger ends first it drops to the smaller's; when the last
    # ends it is back to what it was.
    big_started = anyio.Event()
    big_go = anyio.Event()
    big_done = anyio.Event()
    seen: dict[str, int] = {}

    async def big() -> None:
        big_started.set()
        await big_go.wait()

    async def small() -> None:
        await big_started.wait()
        seen["both"] = _gen0()
        big_go.set()
        await big_done.wait()
        seen["small only"] = _gen0()

    async def run_big() -> None:
        await _strategy(20).run(big)
        seen["after big"] = _gen0()
        big_done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_big)
        tg.start_soon(_strategy(10).run, small)
    assert seen == {
        "both": 20 * _gc.PER_REPLICA,
        "after big": 10 * _gc.PER_REPLICA,
        "small only": 10 * _gc.PER_REPLICA,
    }
    assert _gen0() == DEFAULT


async def test_a_change_made_during_a_run_stands() -> None:
    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        if ctx.replica_id_in_sync_group == 0:
            gc.set_threshold(1234)

    await _strategy(8).run(step)
    assert _gen0() == 1234
    seen: list[int] = []

    async def again() -> None:
        seen.append(_gen0())

    # The next run scales from the user's value, and restores it.
    await _strategy(20).run(again)
    assert set(seen) == {20 * _gc.PER_REPLICA}
    assert _gen0() == 1234


async def test_a_change_during_overlapping_runs_stands_after_both() -> None:
    changed = anyio.Event()

    async def changer() -> None:
        gc.set_threshold(4321)
        changed.set()

    async def waiter() -> None:
        await changed.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(_strategy(10).run, waiter)
        tg.start_soon(_strategy(20).run, changer)
    assert _gen0() == 4321


async def test_automatic_collection_off_is_left_off() -> None:
    gc.set_threshold(0)
    seen: list[int] = []

    async def step() -> None:
        seen.append(_gen0())

    await _strategy(20).run(step)
    assert set(seen) == {0}
    assert _gen0() == 0
