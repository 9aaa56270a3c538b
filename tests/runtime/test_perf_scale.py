"""Per-replica work that does not grow with the replicas, on each loop (issue 17, item 3).

Counted, never timed: wall-clock figures are `asyncreplica bench`'s scale rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import trio

import asyncreplica as ar
from asyncreplica._runtime import _run


def test_trio_arrivals_do_not_ask_asyncio_for_the_current_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The generic helper tries asyncio first, which on trio raises and catches a
    # RuntimeError: once per waiting replica and collective, it was several times
    # the cost of asking trio.
    calls: list[int] = []
    generic = _run._tasks.current_task

    def counting() -> Any:
        calls.append(1)
        return generic()

    monkeypatch.setattr(_run._tasks, "current_task", counting)
    n, rounds = 4, 10

    async def step(x: np.ndarray) -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        for _ in range(rounds):
            await ctx.all_reduce(ar.ReduceOp.SUM, x)

    strategy = ar.MirroredStrategy([f"CPU:{i}" for i in range(n)])
    values = ar.PerReplica([np.ones(2, np.float32) for _ in range(n)])

    async def main() -> None:
        await strategy.run(step, args=(values,))

    trio.run(main)
    assert calls == []
