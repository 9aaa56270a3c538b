"""Objects kept alive per collective: what CPython's garbage collector must scan.

With thousands of replicas, every object that lives across a collective (or across
the 16 collectives of the flight recorder) is promoted to the oldest generation and
scanned again by each full collection (docs/performance.md, "scale"). Counted here,
never timed.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import asyncreplica_numpy._backend as nb
import numpy as np
import pytest

import asyncreplica as ar


def _devices(n: int) -> list[str]:
    return [f"CPU:{i}" for i in range(n)]


def test_the_flight_recorder_keeps_no_object_per_collective(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Live gc-tracked objects at each dispatch (every replica has arrived): the same
    # at the 3rd collective as at the 30th, although the history then holds 16.
    n = 16
    counts: list[int] = []
    original = nb.NumpyBackend.all_reduce

    async def counting(self: nb.NumpyBackend, *args: Any, **kwargs: Any) -> Any:
        counts.append(len(gc.get_objects()))
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(nb.NumpyBackend, "all_reduce", counting)

    async def step(x: np.ndarray) -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        for _ in range(30):
            await ctx.all_reduce(ar.ReduceOp.SUM, x)

    strategy = ar.MirroredStrategy(_devices(n))
    values = ar.PerReplica([np.ones(2, np.float32) for _ in range(n)])
    asyncio.run(strategy.run(step, args=(values,)))  # warm caches
    counts.clear()
    enabled = gc.isenabled()
    gc.disable()
    try:
        asyncio.run(strategy.run(step, args=(values,)))
    finally:
        if enabled:
            gc.enable()
    # One object per replica per collective kept by the history would add 16 x 16.
    assert counts[29] - counts[2] < n, counts


def test_replicas_at_one_call_site_share_one_signature() -> None:
    # Interned: the ledger compares them by identity, and keeps no copy per replica.
    seen: list[bool] = []

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        for _ in range(3):
            await ctx.all_reduce(ar.ReduceOp.SUM, np.ones(4, np.float32))
        await ctx.barrier()
        run = ctx._run
        assert run is not None
        rings = [rep.ring for rep in run.ledger._replicas]
        seen.append(all(ring[:3] == rings[0][:3] for ring in rings))
        seen.append(
            all(a is b for ring in rings for a, b in zip(ring[:3], rings[0][:3], strict=True))
        )

    asyncio.run(ar.MirroredStrategy(_devices(4)).run(step))
    assert all(seen), seen


def test_history_in_reports_is_the_last_16_collectives_in_order() -> None:
    from asyncreplica._core._ledger import HISTORY_SIZE, Ledger
    from asyncreplica._core._signature import CollectiveKind, LeafSpec, Signature

    ledger = Ledger(2)
    signatures = [
        Signature(CollectiveKind.ALL_REDUCE, ar.ReduceOp.SUM, leaves=(LeafSpec((i,), "float32"),))
        for i in range(40)
    ]
    for i, signature in enumerate(signatures):
        ledger.arrive(0, signature)
        ledger.arrive(1, signature)
        if i in (0, 5, 15, 16, 39):
            row = ledger.report().rows[0]
            first = max(0, i + 1 - HISTORY_SIZE)
            assert row.history == tuple((s, signatures[s]) for s in range(first, i + 1))
            assert row.signature is signature
            assert row.position == i + 1


def test_a_waiting_replica_keeps_no_collective_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    # On the fast path a waiting replica is its task, its coroutines and one waiter:
    # the collective it issued is freed once it has arrived (with thousands of
    # replicas, every object that waits is one more cache miss per round to wake).
    from asyncreplica._runtime._run import Collective

    n = 16
    alive: list[int] = []
    runs: list[object] = []
    original = nb.NumpyBackend.all_reduce

    async def counting(self: nb.NumpyBackend, *args: Any, **kwargs: Any) -> Any:
        # Every replica has arrived: only the dispatching replica's collective runs.
        (run,) = set(runs)
        alive.append(sum(type(o) is Collective and o._run is run for o in gc.get_objects()))
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(nb.NumpyBackend, "all_reduce", counting)

    async def step(x: np.ndarray) -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        runs.append(ctx._run)
        for _ in range(3):
            await ctx.all_reduce(ar.ReduceOp.SUM, x)

    strategy = ar.MirroredStrategy(_devices(n))
    values = ar.PerReplica([np.ones(2, np.float32) for _ in range(n)])
    asyncio.run(strategy.run(step, args=(values,)))
    assert alive == [1, 1, 1]
