"""What a waiting replica keeps: bytes and objects per parked replica, by type, per loop.

Replica 0 sleeps (a diagnosis, not a test: the sleep only lets the others park) while
every other replica parks at a small ``all_reduce``; then it counts the live objects
(``gc.get_objects``, by type, with ``sys.getsizeof``) and the traced memory
(``tracemalloc``). The same at two replica counts: the difference over the difference of
the replicas is what one more waiting replica keeps (the run's fixed costs cancel out).
``--bare`` measures the bare rendezvous on the same loop's own primitives instead.

Run: ``python benchmarks/scale_memory.py [--loops asyncio uvloop trio] [--bare]``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import sys
import tracemalloc
from typing import Any

import anyio
import numpy as np

import asyncreplica as ar

_SIZES = (512, 1024)


def _census() -> tuple[collections.Counter[str], collections.Counter[str], int]:
    """Live gc-tracked objects and their bytes, by type name, and the traced bytes."""
    gc.collect()
    count: collections.Counter[str] = collections.Counter()
    size: collections.Counter[str] = collections.Counter()
    for obj in gc.get_objects():
        name = type(obj).__name__
        count[name] += 1
        size[name] += sys.getsizeof(obj)
    return count, size, tracemalloc.get_traced_memory()[0]


def _ours(loop: str, n: int) -> tuple[collections.Counter[str], collections.Counter[str], int]:
    found: list[Any] = []
    value = ar.PerReplica([np.full(2, float(i + 1), np.float32) for i in range(n)])
    strategy = ar.MirroredStrategy([f"CPU:{i}" for i in range(n)])

    async def step(x: Any) -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        for _ in range(3):  # the census in the third round: steady state
            if ctx.replica_id_in_sync_group == 0:
                await anyio.sleep(0.2)
                if len(found) == 2:
                    found.append(_census())
                else:
                    found.append(None)
            await ctx.all_reduce(ar.ReduceOp.SUM, x)

    async def go() -> None:
        await strategy.run(step, args=(value,))

    _start(loop, go)
    return found[-1]  # type: ignore[no-any-return]


def _bare(loop: str, n: int) -> tuple[collections.Counter[str], collections.Counter[str], int]:
    """The bare rendezvous of ``asyncreplica._tools._bench._baselines`` with replica 0 late."""
    found: list[Any] = []
    inputs = [np.full(2, float(i + 1), np.float32) for i in range(n)]
    arrived = [0]
    waiters: list[Any] = []

    def total() -> Any:
        out = np.add(inputs[0], inputs[1])
        for a in inputs[2:]:
            np.add(out, a, out=out)
        return out

    if loop == "trio":
        import outcome
        import trio

        async def all_reduce() -> Any:
            arrived[0] += 1
            if arrived[0] == n:
                out = total()
                for task in waiters:
                    trio.lowlevel.reschedule(task, outcome.Value(out))
                arrived[0] = 0
                waiters.clear()
                return out
            waiters.append(trio.lowlevel.current_task())
            return await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)

    else:

        async def all_reduce() -> Any:
            arrived[0] += 1
            if arrived[0] == n:
                out = total()
                for w in waiters:
                    w.set_result(out)
                arrived[0] = 0
                waiters.clear()
                return out
            fut = asyncio.get_running_loop().create_future()
            waiters.append(fut)
            return await fut

    async def replica(i: int) -> None:
        for r in range(3):
            if i == 0:
                await anyio.sleep(0.2)
                found.append(_census() if r == 2 else None)
            await all_reduce()

    async def go() -> None:
        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(replica, i)

    _start(loop, go)
    return found[-1]  # type: ignore[no-any-return]


def _start(loop: str, go: Any) -> None:
    if loop == "asyncio":
        asyncio.run(go())
    elif loop == "uvloop":
        import uvloop

        uvloop.run(go())
    else:
        import trio

        trio.run(go)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", nargs="+", default=["asyncio", "uvloop", "trio"])
    parser.add_argument("--bare", action="store_true")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    tracemalloc.start()
    measure = _bare if args.bare else _ours
    lo, hi = _SIZES
    for loop in args.loops:
        c1, s1, t1 = measure(loop, lo)
        c2, s2, t2 = measure(loop, hi)
        per = hi - lo
        objects = (sum(c2.values()) - sum(c1.values())) / per
        size = (sum(s2.values()) - sum(s1.values())) / per
        traced = (t2 - t1) / per
        system = "bare" if args.bare else "ours"
        print(
            f"{loop} {system}: per waiting replica {objects:.1f} gc objects, "
            f"{size:.0f} B by getsizeof, {traced:.0f} B traced"
        )
        names = sorted(set(c1) | set(c2), key=lambda k: -(s2[k] - s1[k]))
        for name in names[: args.top]:
            dc = (c2[name] - c1[name]) / per
            ds = (s2[name] - s1[name]) / per
            if dc or ds:
                print(f"    {name:<28}{dc:>6.2f} objects{ds:>8.0f} B")


if __name__ == "__main__":
    main()
