"""The cost of the ordering checks on a small all_reduce, measured in one run.

Compares, per all_reduce of 8 bytes (2 x float32) across N replicas on asyncio:

* ``bare``: a bare futures rendezvous doing the same numpy sum (the floor: the last
  arrival sums in replica order and sets one future per waiter);
* ``no call sites``: asyncreplica with ``check_call_sites=False``;
* ``no checks``: asyncreplica with the ordering checks stubbed out for the
  measurement only (no call-path capture, no signature comparison); leaves are still
  described, since that also validates them and the backend needs it: what a
  collective would cost if replicas' collectives were not checked against each other;
* ``full checks``: asyncreplica with every check on (the default);
* ``full + tracing``: the same inside ``strategy.trace(...)`` (the Perfetto recorder);
* ``bare arrival``: asyncreplica's run, replica tasks and numpy backend, with each
  arrival (``ReplicaContext.all_reduce`` and its ``await``: validation, ledger,
  signature, call path, slot and waiter) replaced, for the measurement only, by a bare
  futures rendezvous in Python: what everything else costs, so the least an arrival
  compiled to C could bring the whole to.

Run: ``python benchmarks/bench_checks.py [--replicas 8] [--rounds 2000] [--repeat 5]``.
Prints the best of the repeats in microseconds per collective, and the ratios.

``no checks`` and ``bare arrival`` replace module functions and a method at run time, which
the compiled hot path does not see (its calls are native): on a compiled install they are
measured only with ``ASYNCREPLICA_NO_EXTENSIONS=1`` and left out otherwise, with a note.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Generator
from typing import Any, ClassVar

import numpy as np

import asyncreplica as ar
from asyncreplica import _compiled


async def bare(n: int, rounds: int, value: np.ndarray) -> float:
    loop = asyncio.get_running_loop()
    state: dict[str, object] = {"arrived": 0, "inputs": [None] * n, "waiters": []}

    async def all_reduce(rid: int, x: np.ndarray) -> np.ndarray:
        inputs = state["inputs"]
        assert isinstance(inputs, list)
        inputs[rid] = x
        state["arrived"] = int(state["arrived"]) + 1  # type: ignore[call-overload]
        if state["arrived"] == n:
            out = np.add(inputs[0], inputs[1]) if n > 1 else inputs[0].copy()
            for a in inputs[2:]:
                np.add(out, a, out=out)
            waiters = state["waiters"]
            assert isinstance(waiters, list)
            for fut in waiters:
                fut.set_result(out)
            state["arrived"], state["waiters"] = 0, []
            return out
        fut = loop.create_future()
        waiters = state["waiters"]
        assert isinstance(waiters, list)
        waiters.append(fut)
        return await fut  # type: ignore[no-any-return]

    async def replica(rid: int) -> None:
        for _ in range(rounds):
            await all_reduce(rid, value)

    start = time.perf_counter()
    await asyncio.gather(*(replica(i) for i in range(n)))
    return time.perf_counter() - start


async def ours(strategy: ar.MirroredStrategy, rounds: int, value: np.ndarray) -> float:
    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        for _ in range(rounds):
            await ctx.all_reduce(ar.ReduceOp.SUM, value)

    start = time.perf_counter()
    await strategy.run(step)
    return time.perf_counter() - start


def _without_checks() -> list[tuple[object, str, object]]:
    """Stub out the checks (for this measurement only); return what to restore."""
    from asyncreplica._core import _ledger
    from asyncreplica._runtime import _context, _issuing

    saved = [
        (_context, "call_path", _context.call_path),
        (_issuing, "call_path", _issuing.call_path),
        (_ledger, "differing_fields", _ledger.differing_fields),
    ]
    _context.call_path = lambda: ()  # type: ignore[assignment]
    _issuing.call_path = lambda: ()  # type: ignore[assignment]
    _ledger.differing_fields = lambda *a, **k: ()  # type: ignore[assignment]
    return saved


def _restore(saved: list[tuple[object, str, object]]) -> None:
    for owner, name, value in saved:
        setattr(owner, name, value)


class _BareArrival:
    """``ctx.all_reduce(op, x)`` as a bare futures rendezvous over the run's backend."""

    __slots__ = ("ctx", "value")
    rounds: ClassVar[dict[int, list[Any]]] = {}  # id(run) -> [arrived, payloads, waiters]

    def __init__(self, ctx: Any, value: Any) -> None:
        self.ctx = ctx
        self.value = value

    def __await__(self) -> Generator[Any, None, Any]:
        run = self.ctx._run
        state = self.rounds.get(id(run))
        if state is None:
            state = self.rounds[id(run)] = [0, [None] * run.num_replicas, []]
        replica = self.ctx._replica_id
        state[1][replica] = [self.value]
        state[0] += 1
        if state[0] == run.num_replicas:
            return self._dispatch(run, state, replica).__await__()
        waiter = run._loop.create_future()
        state[2].append((replica, waiter))
        return waiter.__await__()  # type: ignore[no-any-return]

    @staticmethod
    async def _dispatch(run: Any, state: list[Any], replica: int) -> Any:
        results = await run.backend.all_reduce(ar.ReduceOp.SUM, state[1])
        waiters = state[2]
        state[:] = [0, [None] * run.num_replicas, []]
        for r, waiter in waiters:
            waiter.set_result(results[r][0])
        return results[replica][0]


def _bare_arrival() -> list[tuple[object, str, object]]:
    """Replace each arrival by :class:`_BareArrival` (for this measurement only)."""
    from asyncreplica._runtime._context import ReplicaContext

    saved: list[tuple[object, str, object]] = [
        (ReplicaContext, "all_reduce", ReplicaContext.all_reduce)
    ]
    ReplicaContext.all_reduce = lambda self, op, value, *a, **k: _BareArrival(self, value)  # type: ignore[method-assign]
    return saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    n, rounds = args.replicas, args.rounds
    value = np.ones(2, dtype=np.float32)
    devices = [f"CPU:{i}" for i in range(n)]
    full = ar.MirroredStrategy(devices)
    relaxed = ar.MirroredStrategy(devices, check_call_sites=False)
    times: dict[str, list[float]] = {
        "bare": [],
        "no checks": [],
        "no call sites": [],
        "full checks": [],
        "full + tracing": [],
        "bare arrival": [],
    }
    patchable = not _compiled.current().compiled
    if not patchable:
        del times["no checks"], times["bare arrival"]
    for _ in range(args.repeat):  # interleaved, so drift hits every system alike
        times["bare"].append(asyncio.run(bare(n, rounds, value)))
        if patchable:
            saved = _without_checks()
            try:
                times["no checks"].append(asyncio.run(ours(relaxed, rounds, value)))
            finally:
                _restore(saved)
        times["no call sites"].append(asyncio.run(ours(relaxed, rounds, value)))
        times["full checks"].append(asyncio.run(ours(full, rounds, value)))
        with tempfile.TemporaryDirectory() as tmp, full.trace(f"{tmp}/trace.json"):
            times["full + tracing"].append(asyncio.run(ours(full, rounds, value)))
        if patchable:
            saved = _bare_arrival()
            try:
                times["bare arrival"].append(asyncio.run(ours(full, rounds, value)))
            finally:
                _restore(saved)
                _BareArrival.rounds.clear()
    # The minimum: on a shared machine, noise only ever adds time.
    medians = {k: min(v) / rounds * 1e6 for k, v in times.items()}
    print(f"small all_reduce (8 B), {n} replicas, asyncio, {rounds} rounds x {args.repeat}")
    print(f"hot path: {_compiled.current().describe()}")
    if not patchable:
        print("(no checks, bare arrival: run with ASYNCREPLICA_NO_EXTENSIONS=1 to measure them)")
    floor = medians.get("no checks")
    print(f"{'system':<16}{'us/collective':>14}{'vs bare':>10}{'vs no checks':>14}")
    for name, us in medians.items():
        versus = f"{us / floor:>13.2f}x" if floor else f"{'-':>14}"
        print(f"{name:<16}{us:>14.1f}{us / medians['bare']:>9.2f}x{versus}")


if __name__ == "__main__":
    main()
