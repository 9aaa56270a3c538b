"""Batched all_reduce: 1000 leaves x 1 KiB at 4 replicas, against its two references.

Compares, per round (best of repeats, asyncio, every check on):

* ``batched``: one ``all_reduce`` of a list of 1000 float32 arrays of 1 KiB (packed), with
  the pass over the batch that runs (``asyncreplica doctor``'s ``batch pass``: the compiled C
  pass when the build made it);
* ``batched, Python``: the same with the pure-Python pass (only when the C pass runs, so that
  both are measured interleaved, in one process);
* ``one 1000 KiB``: one ``all_reduce`` of a single 1000 KiB array (the target: <= 5x);
* ``1000 separate``: 1000 ``all_reduce`` calls of 1 KiB each (the target: >= 10x slower);
* ``numpy floor``: the least per-leaf work with no rendezvous and no checks (join, sum,
  one read-only view per leaf and replica), as ``asyncreplica bench`` measures it.

Ratios are given against ``one 1000 KiB``, the figure the target is stated in.

Run: ``python benchmarks/bench_packing.py [--replicas 4] [--rounds 20] [--repeat 5]
[--no-separate]``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from asyncreplica_numpy import NumpyBackend
from asyncreplica_numpy._backend import batch_pass

import asyncreplica as ar
from asyncreplica._tools._bench._baselines import _batch_floor

LEAVES = 1000
LEAF = 256  # float32 elements: 1 KiB


def _time(
    strategy: ar.MirroredStrategy,
    step: Callable[[Any], Awaitable[None]],
    x: Any,
    python_pass: bool = False,
) -> float:
    backend = strategy.backend
    assert isinstance(backend, NumpyBackend)
    native = backend._cpass
    if python_pass:
        backend._cpass = None
    try:
        start = time.perf_counter()
        asyncio.run(strategy.run(step, args=(x,)))
        return time.perf_counter() - start
    finally:
        backend._cpass = native


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--bytes-per-pack", type=int, default=0)
    parser.add_argument("--no-separate", action="store_true", help="skip the slow 1000-call row")
    args = parser.parse_args()
    rounds = args.rounds
    strategy = ar.MirroredStrategy([f"CPU:{i}" for i in range(args.replicas)])
    options = ar.CommunicationOptions(bytes_per_pack=args.bytes_per_pack)
    n = args.replicas
    # Every replica its own arrays, as in training (no input shared between replicas).
    leaves = ar.PerReplica(
        [[np.full(LEAF, r, np.float32) for _ in range(LEAVES)] for r in range(n)]
    )
    whole = ar.PerReplica([np.full(LEAF * LEAVES, r, np.float32) for r in range(n)])

    async def batched(xs: list[np.ndarray]) -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        for _ in range(rounds):
            await ctx.all_reduce("sum", xs, options)

    async def one(x: np.ndarray) -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        for _ in range(rounds):
            await ctx.all_reduce("sum", x)

    async def separate(xs: list[np.ndarray]) -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        for _ in range(rounds):
            for leaf in xs:
                await ctx.all_reduce("sum", leaf)

    systems = {
        "batched": (batched, leaves, False),
        "batched, Python": (batched, leaves, True),
        "one 1000 KiB": (one, whole, False),
        "1000 separate": (separate, leaves, False),
    }
    if not batch_pass().startswith("compiled"):
        del systems["batched, Python"]  # "batched" is it
    if args.no_separate:
        del systems["1000 separate"]
    times: dict[str, list[float]] = {k: [] for k in [*systems, "numpy floor"]}
    for _ in range(args.repeat):  # interleaved
        for name, (step, x, python_pass) in systems.items():
            times[name].append(_time(strategy, step, x, python_pass))
        times["numpy floor"].append(_batch_floor([list(v) for v in leaves.values], rounds))
    best = {k: min(v) / rounds * 1e3 for k, v in times.items()}
    print(
        f"batched all_reduce, {LEAVES} x 1 KiB float32, {args.replicas} replicas, asyncio, "
        f"bytes_per_pack={args.bytes_per_pack}, {rounds} rounds x {args.repeat}"
    )
    print(f"batch pass: {batch_pass()}")
    one = best["one 1000 KiB"]
    print(f"{'system':<18}{'ms/round':>10}{'vs one 1000 KiB':>17}")
    for name, ms in best.items():
        print(f"{name:<18}{ms:>10.3f}{ms / one:>16.2f}x")


if __name__ == "__main__":
    main()
