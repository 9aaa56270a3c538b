"""Per-replica cost of a small all_reduce at few and many replicas, start-up excluded.

Each system runs ``R`` and ``2 R`` rounds; the difference of the two (best of the
repeats each) is the cost of ``R`` rounds without starting the run's tasks, divided by
``R`` and the number of replicas. The same measurement as ``asyncreplica bench``'s
scale rows, with the time the cyclic garbage collector took in ours (per generation).

Ours runs on each loop asked for (asyncio, uvloop, trio), and so does the bare rendezvous
on that loop's own primitives (asyncio futures; on trio ``wait_task_rescheduled``): each
loop's reference. The gc figures are ours on the first loop.

Run: ``python benchmarks/bench_scale.py [--replicas 8 4096] [--repeat 5]
[--loops asyncio uvloop trio]``.
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any

import numpy as np

import asyncreplica as ar
from asyncreplica._tools._bench._baselines import _rendezvous
from asyncreplica._tools._bench._cases import _run_ours, _step


class _GcTimer:
    """Time spent in each generation's collections, and how many there were."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._start
            self.count[info["generation"]] += 1


def _ours(
    strategy: ar.MirroredStrategy, value: ar.PerReplica[Any], rounds: int, loop: str
) -> float:
    """Seconds of a run of ``rounds`` small all_reduces (the bench's own case)."""
    return _run_ours(loop, strategy, _step("all_reduce", rounds), value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[8, 4096])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--loops", nargs="+", default=["asyncio"], choices=["asyncio", "uvloop", "trio"]
    )
    parser.add_argument("--budget", type=int, default=40_000, help="replica-rounds per sample")
    parser.add_argument(
        "--no-gc", action="store_true", help="with the cyclic garbage collector off (diagnosis)"
    )
    args = parser.parse_args()
    if args.no_gc:
        gc.disable()
    costs: dict[int, dict[str, float]] = {}
    for n in args.replicas:
        rounds = max(4, args.budget // n)
        inputs = [np.full(2, float(i + 1), np.float32) for i in range(n)]
        strategy = ar.MirroredStrategy([f"CPU:{i}" for i in range(n)])
        value = ar.PerReplica(inputs)
        times: dict[tuple[str, int], list[float]] = {}
        timer = _GcTimer()
        for _ in range(args.repeat):
            for r in (rounds, 2 * rounds):
                for loop in args.loops:
                    bare = _rendezvous(loop, inputs, r)
                    times.setdefault((f"bare {loop}", r), []).append(bare)
                    if r == 2 * rounds and loop == args.loops[0]:
                        gc.callbacks.append(timer)
                    try:
                        times.setdefault((loop, r), []).append(_ours(strategy, value, r, loop))
                    finally:
                        if timer in gc.callbacks:
                            gc.callbacks.remove(timer)
        costs[n] = {
            system: max(min(times[(system, 2 * rounds)]) - min(times[(system, rounds)]), 1e-9)
            / rounds
            / n
            * 1e6
            for system in (*args.loops, *(f"bare {loop}" for loop in args.loops))
        }
        cost = costs[n]
        per = args.repeat * 2 * rounds * n  # replica-collectives under the gc timer
        gc_us = [t / per * 1e6 for t in timer.seconds]
        ours = ", ".join(f"{loop} {cost[loop]:6.2f}" for loop in args.loops)
        bare = ", ".join(f"{loop} {cost[f'bare {loop}']:5.2f}" for loop in args.loops)
        print(
            f"{n:>6} replicas x {rounds:>5} rounds: ours ({ours}) us/replica, "
            f"bare ({bare}) us/replica; in ours, gc per replica-collective: "
            f"{sum(gc_us):5.2f} us (gen0/1/2: {gc_us[0]:.2f}/{gc_us[1]:.2f}/{gc_us[2]:.2f} us, "
            f"runs {timer.count[0]}/{timer.count[1]}/{timer.count[2]})",
            flush=True,
        )
    first, last = min(costs), max(costs)
    for system in (*args.loops, *(f"bare {loop}" for loop in args.loops)):
        print(
            f"ratio {last} vs {first}, {system}: {costs[last][system] / costs[first][system]:.2f}x"
        )


if __name__ == "__main__":
    main()
