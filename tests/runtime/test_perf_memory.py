"""Per-collective costs that must not grow: memory held, and work per replica.

Deterministic counts only (traced bytes, Python line events), never timings: speed is
measured by ``asyncreplica bench`` (docs/performance.md), not asserted here.
"""

from __future__ import annotations

import asyncio
import sys
import tracemalloc
from types import FrameType
from typing import Any

import numpy as np
import pytest

import asyncreplica as ar


def _devices(n: int) -> list[str]:
    return [f"CPU:{i}" for i in range(n)]


def _traced_growth(values: Any, rounds: int) -> int:
    """Bytes still allocated after ``rounds`` more collectives than a warmed-up point."""
    strategy = ar.MirroredStrategy(_devices(2))
    marks: list[int] = []

    async def step(x: Any) -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        for i in range(rounds * 2):
            if i in (rounds // 2, rounds * 2 - 1) and ctx.replica_id_in_sync_group == 0:
                marks.append(tracemalloc.get_traced_memory()[0])
            await ctx.all_reduce(ar.ReduceOp.SUM, x)

    tracemalloc.start()
    try:
        asyncio.run(strategy.run(step, args=(values,)))
    finally:
        tracemalloc.stop()
    return marks[1] - marks[0]


@pytest.mark.parametrize(
    ("values", "rounds"),
    [
        pytest.param(
            ar.PerReplica([np.ones(2, np.float32), np.ones(2, np.float32)]), 1500, id="8B"
        ),
        pytest.param(
            ar.PerReplica([[np.full(16, r, np.float32) for _ in range(50)] for r in range(2)]),
            300,
            id="batch-of-50",
        ),
        pytest.param(
            ar.PerReplica([np.full(1 << 18, r, np.float32) for r in range(2)]),
            300,
            id="1MiB-pooled",
        ),
    ],
)
def test_memory_held_does_not_grow_with_the_number_of_collectives(values: Any, rounds: int) -> None:
    growth = _traced_growth(values, rounds)
    # One leaked object per collective (a tuple is 40 bytes or more) would hold 40
    # bytes x 1.5 rounds or more; free lists and caches settle long before.
    assert growth < 16 * rounds, growth


def _lines_per_collective(n: int, rounds: int) -> float:
    """Python line events per collective, start-up excluded (two run lengths)."""
    strategy = ar.MirroredStrategy(_devices(n))
    per_replica = ar.PerReplica([np.ones(2, np.float32) * r for r in range(n)])

    def count(r: int) -> int:
        async def step(x: Any) -> None:
            ctx = ar.get_replica_context()
            assert ctx is not None
            for _ in range(r):
                await ctx.all_reduce(ar.ReduceOp.SUM, x)

        events = [0]

        def local(frame: FrameType, event: str, arg: object) -> Any:
            if event == "line":
                events[0] += 1
            return local

        def trace(frame: FrameType, event: str, arg: object) -> Any:
            return local

        sys.settrace(trace)
        try:
            asyncio.run(strategy.run(step, args=(per_replica,)))
        finally:
            sys.settrace(None)
        return events[0]

    count(rounds)  # warm caches (call paths, leaf specs)
    return (count(2 * rounds) - count(rounds)) / rounds


def test_work_per_replica_per_collective_does_not_grow_with_replicas() -> None:
    # O(N) per collective: the Python work per replica is the same at 4 and 64 replicas
    # (counted in line events, which are deterministic; a loop over replicas inside
    # each replica's arrival would multiply it by 16).
    small = _lines_per_collective(4, 10) / 4
    large = _lines_per_collective(64, 10) / 64
    assert large <= small * 1.25, (small, large)


def test_the_ledger_keeps_no_state_per_completed_collective() -> None:
    strategy = ar.MirroredStrategy(_devices(3))
    seen: list[tuple[int, int]] = []

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        for _ in range(100):
            await ctx.all_reduce(ar.ReduceOp.SUM, 1.0)
        run = ctx._run
        assert run is not None
        ledger = run.ledger
        seen.append((len(ledger._rounds), max(len(r.history) for r in ledger._replicas)))

    asyncio.run(strategy.run(step))
    # At most the one collective a replica may still be completing; history is bounded.
    assert all(rounds <= 1 and history <= 16 for rounds, history in seen), seen
