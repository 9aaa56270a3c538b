"""The measured cases: our collectives, each interleaved with its baselines."""

from __future__ import annotations

import asyncio
import importlib.util
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import asyncreplica as ar

from ._baselines import (
    _batch_floor,
    _blocked_sum,
    _copy_all,
    _copy_one,
    _devices,
    _difference,
    _futures,
    _inputs,
    _median_us,
    _numpy_floor,
    _rendezvous,
    _steady,
    _timed,
)
from ._model import Array, Row, _size


@dataclass
class Plan:
    """What to measure."""

    sizes: list[int]
    replicas: list[int]
    many_replicas: list[int]
    loops: list[str]
    repeat: int
    budget_bytes: int  # bytes per timing sample, which sets the rounds
    move_sizes: list[int] = field(default_factory=lambda: [1 << 20])
    batch_rounds: int = 10
    memory_collectives: int = 100_000
    idle_replicas: int = 10_000
    scale_budget: int = 40_000  # replica-rounds per scale sample (at least 4 rounds)


def _step(kind: str, rounds: int) -> Callable[[Any], Coroutine[Any, Any, None]]:
    async def step(x: Any) -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        for _ in range(rounds):
            if kind == "all_reduce":
                await ctx.all_reduce(ar.ReduceOp.SUM, x)
            elif kind == "all_gather":
                await ctx.all_gather(x, axis=0)
            elif kind == "broadcast":
                await ctx.broadcast(x)
            elif kind == "reduce_scatter":
                await ctx.reduce_scatter(ar.ReduceOp.SUM, x, axis=0)
            else:
                raise ValueError(kind)

    return step


def _run_ours(loop: str, strategy: ar.MirroredStrategy, step: Any, value: Any) -> float:
    async def go() -> float:
        start = time.perf_counter()
        await strategy.run(step, args=(value,))
        return time.perf_counter() - start

    if loop == "asyncio":
        return asyncio.run(go())
    if loop == "uvloop":
        import uvloop

        return uvloop.run(go())
    import trio

    return trio.run(go)


def _ours(
    loop: str, strategy: ar.MirroredStrategy, kind: str, value: Any
) -> Callable[[int], float]:
    """``rounds -> seconds`` of a run of ``kind`` collectives (for :func:`_steady`)."""
    return lambda rounds: _run_ours(loop, strategy, _step(kind, rounds), value)


def _loops() -> list[str]:
    loops = ["asyncio"]
    for name in ("uvloop", "trio"):
        if importlib.util.find_spec(name) is not None:
            loops.append(name)
    return loops


def _rounds(plan: Plan, nbytes: int, n: int) -> int:
    # At least 20 rounds below 64 MiB per round, so that the steady time (a difference
    # of two runs, see _steady) stands well above the noise of a run's start-up.
    least = 4 if nbytes * n >= 64 << 20 else 20
    return int(min(2000, max(least, plan.budget_bytes // max(nbytes * n, 1))))


def _measure_all_reduce(plan: Plan, progress: Callable[[str], None]) -> list[Row]:
    rows: list[Row] = []
    for n in plan.replicas:
        for nbytes in plan.sizes:
            inputs = _inputs(n, nbytes)
            rounds = _rounds(plan, nbytes, n)
            progress(f"all_reduce {_size(nbytes)} x {n} replicas ({rounds} rounds)")
            strategy = ar.MirroredStrategy(_devices(n))
            per_replica = ar.PerReplica(inputs)
            threads = nbytes >= 1 << 20
            base: list[float] = []
            floor1: list[float] = []
            floor2: list[float] = []
            ours: dict[str, list[float]] = {loop: [] for loop in plan.loops}
            startup: list[float] = []
            # One untimed round of each first: the allocator's first large blocks and
            # the pool's first buffers cost page faults no later round pays.
            _futures(inputs)(1)
            for loop in plan.loops:
                _ours(loop, strategy, "all_reduce", per_replica)(1)
            for _ in range(plan.repeat):  # interleaved, so drift hits every system alike
                base.append(_steady(_futures(inputs), rounds))
                floor1.append(_numpy_floor(inputs, rounds))
                if threads:
                    floor2.append(_numpy_floor(inputs, rounds, threads=2))
                for loop in plan.loops:
                    sample = _ours(loop, strategy, "all_reduce", per_replica)
                    ours[loop].append(_steady(sample, rounds))
                    if loop == "asyncio" and nbytes == plan.sizes[0]:
                        startup.append(sample(0))  # a run of no rounds: its start-up
            base_us = _median_us(base, rounds)
            floors = {"numpy floor (1 thread)": _median_us(floor1, rounds)}
            if threads:
                floors["numpy floor (2 threads)"] = _median_us(floor2, rounds)
            best_floor = min(floors.items(), key=lambda kv: kv[1])
            baseline = best_floor if threads else ("futures", base_us)
            for loop, samples in ours.items():
                us = _median_us(samples, rounds)
                rows.append(
                    Row("all_reduce", n, nbytes, loop, "asyncreplica", us, *baseline, samples)
                )
            rows.append(
                Row("all_reduce", n, nbytes, "asyncio", "futures", base_us, *best_floor, base)
            )
            for name, value in floors.items():
                rows.append(Row("all_reduce", n, nbytes, "-", name, value, *best_floor))
            if nbytes == plan.sizes[0]:
                # Reported, not a target: what starting a run costs (left out above).
                us = statistics.median(startup) * 1e6
                rows.append(
                    Row(
                        "run start-up",
                        n,
                        nbytes,
                        "asyncio",
                        "asyncreplica",
                        us,
                        "one round",
                        _median_us(ours["asyncio"], rounds),
                        startup,
                    )
                )
    return rows


# The bare rendezvous each loop's scale figure is read against (its per-replica cost is
# the row's baseline): futures on asyncio and uvloop, trio's own parking on trio.
SCALE_REFERENCE = {
    "asyncio": "futures",
    "uvloop": "futures",
    "trio": "trio rendezvous",
}


def _measure_scale(plan: Plan, progress: Callable[[str], None]) -> list[Row]:
    """Per-replica cost of a small all_reduce, run start-up excluded, on every loop.

    Each system runs ``R`` and ``2 R`` rounds; the difference of the two (best of the
    repeats each) is the cost of ``R`` rounds without starting the run's tasks. Ours
    runs on each loop of the plan (the target holds on each), and so does the bare
    rendezvous on that loop's own primitives (:func:`_rendezvous`: asyncio futures, or
    trio's ``wait_task_rescheduled``), each loop's reference: its growth is what the
    minimal implementation does on that loop. The systems are interleaved, so drift
    hits all alike.
    """
    rows: list[Row] = []
    nbytes = 8
    for n in plan.many_replicas:
        inputs = _inputs(n, nbytes)
        rounds = max(4, plan.scale_budget // n)
        progress(f"scale: all_reduce {nbytes} B x {n} replicas ({rounds} and {2 * rounds} rounds)")
        strategy = ar.MirroredStrategy(_devices(n))
        per_replica = ar.PerReplica(inputs)
        times: dict[tuple[str, int], list[float]] = {}
        for _ in range(plan.repeat):
            for r in (rounds, 2 * rounds):
                for loop in plan.loops:
                    bare = _rendezvous(loop, inputs, r)
                    times.setdefault((f"bare {loop}", r), []).append(bare)
                    ours = _run_ours(loop, strategy, _step("all_reduce", r), per_replica)
                    times.setdefault((loop, r), []).append(ours)
        cost = {
            system: _difference(min(times[(system, 2 * rounds)]), min(times[(system, rounds)]))
            / rounds
            / n
            * 1e6
            for system in {system for system, _ in times}
        }
        for loop in plan.loops:
            rows.append(
                Row(
                    "scale (per replica)",
                    n,
                    nbytes,
                    loop,
                    "asyncreplica",
                    cost[loop],
                    f"{SCALE_REFERENCE[loop]}, per replica",
                    cost[f"bare {loop}"],
                    times[(loop, rounds)],
                )
            )
    return rows


def _measure_tracing(plan: Plan, progress: Callable[[str], None]) -> list[Row]:
    """A small all_reduce with the Perfetto tracer on, against the same with it off."""
    n, nbytes = 8, 8
    rounds = 1000 if plan.repeat > 3 else 300
    progress(f"tracing: all_reduce {nbytes} B x {n} replicas, trace on and off")
    strategy = ar.MirroredStrategy(_devices(n))
    per_replica = ar.PerReplica(_inputs(n, nbytes))
    off: list[float] = []
    on: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(plan.repeat):
            off.append(_steady(_ours("asyncio", strategy, "all_reduce", per_replica), rounds))
            with strategy.trace(os.path.join(tmp, f"trace{i}.json")):
                on.append(_steady(_ours("asyncio", strategy, "all_reduce", per_replica), rounds))
    return [
        Row(
            "tracing on",
            n,
            nbytes,
            "asyncio",
            "asyncreplica + trace",
            _median_us(on, rounds),
            "asyncreplica, trace off",
            _median_us(off, rounds),
            on,
        )
    ]


# What each data-moving collective must do at the least, and how its floor is named.
_MOVES: dict[str, tuple[str, Callable[[list[Array]], Callable[[], Array]]]] = {
    "all_gather": ("bytes floor (copy N inputs)", _copy_all),
    "broadcast": ("bytes floor (copy 1 input)", _copy_one),
    "reduce_scatter": ("bytes floor (sum N inputs)", _blocked_sum),
}


def _measure_moves(plan: Plan, progress: Callable[[str], None]) -> list[Row]:
    """all_gather, broadcast and reduce_scatter against the bytes they must move.

    Each kind has two baselines, measured interleaved with ours: its bytes floor (the
    copy or sum alone, into one preallocated output) and the bare futures rendezvous
    doing that same work in its last arrival: the least any rendezvous of the replicas
    costs on top of the bytes, which the target's ratio must also carry.
    """
    rows: list[Row] = []
    n = 8
    strategy = ar.MirroredStrategy(_devices(n))
    for nbytes in plan.move_sizes:
        inputs = _inputs(n, nbytes)
        per_replica = ar.PerReplica(inputs)
        rounds = _rounds(plan, nbytes, n)
        works = {kind: make(inputs) for kind, (_, make) in _MOVES.items()}
        floor: dict[str, list[float]] = {kind: [] for kind in _MOVES}
        futures: dict[str, list[float]] = {kind: [] for kind in _MOVES}
        ours: dict[str, list[float]] = {kind: [] for kind in _MOVES}
        progress(f"all_gather, broadcast, reduce_scatter {_size(nbytes)} x {n} replicas")
        for kind, work in works.items():  # one untimed round of each
            work()
            _futures(inputs, work)(1)
            _ours("asyncio", strategy, kind, per_replica)(1)
        for _ in range(plan.repeat):  # interleaved
            for kind, work in works.items():
                floor[kind].append(_timed(work, rounds))
                futures[kind].append(_steady(_futures(inputs, work), rounds))
                ours[kind].append(_steady(_ours("asyncio", strategy, kind, per_replica), rounds))
        for kind, (name, _) in _MOVES.items():
            floor_us = _median_us(floor[kind], rounds)
            us = _median_us(ours[kind], rounds)
            rows.append(
                Row(kind, n, nbytes, "asyncio", "asyncreplica", us, name, floor_us, ours[kind])
            )
            us = _median_us(futures[kind], rounds)
            rows.append(
                Row(kind, n, nbytes, "asyncio", "futures", us, name, floor_us, futures[kind])
            )
    return rows


# Issue 18's array types: the case's name, and each library's name and constructor.
ARRAY_TYPES_CASE = "all_reduce array type"
NUMPY_INPUTS = "numpy inputs"
NOT_INSTALLED = "not installed"


def _jax_array(a: Array) -> Any:
    import jax.numpy as jnp

    return jnp.asarray(a)


def _strict_array(a: Array) -> Any:
    import array_api_strict as xp

    return xp.asarray(a)


_ARRAY_TYPES: dict[str, tuple[str, Callable[[Array], Any]]] = {
    "jax": ("jax", _jax_array),
    "array_api_strict": ("array_api_strict", _strict_array),
}


def _measure_array_types(plan: Plan, progress: Callable[[str], None]) -> list[Row]:
    """A 1 MiB x 8 all_reduce of JAX and array_api_strict inputs against numpy inputs.

    Interleaved with the numpy inputs' run, which is each row's baseline. A library
    that is not installed gets a row not measured (``-``), and no target.
    """
    n, nbytes = 8, 1 << 20
    inputs = _inputs(n, nbytes)
    rounds = _rounds(plan, nbytes, n)
    strategy = ar.MirroredStrategy(_devices(n))
    values = {"numpy": ar.PerReplica(inputs)}
    for name, (module, make) in _ARRAY_TYPES.items():
        if importlib.util.find_spec(module) is not None:
            values[name] = ar.PerReplica([make(a) for a in inputs])
    progress(f"all_reduce {_size(nbytes)} x {n} replicas of {', '.join(values)} inputs")
    samples: dict[str, list[float]] = {name: [] for name in values}
    for per_replica in values.values():  # one untimed round of each
        _ours("asyncio", strategy, "all_reduce", per_replica)(1)
    for _ in range(plan.repeat):  # interleaved
        for name, per_replica in values.items():
            sample = _ours("asyncio", strategy, "all_reduce", per_replica)
            samples[name].append(_steady(sample, rounds))
    numpy_us = _median_us(samples["numpy"], rounds)
    rows: list[Row] = []
    for name in ["numpy", *_ARRAY_TYPES]:
        if name in samples:
            us = _median_us(samples[name], rounds)
            baseline, baseline_us = NUMPY_INPUTS, numpy_us
        else:
            us, baseline, baseline_us = math.nan, NOT_INSTALLED, math.nan
        case = ARRAY_TYPES_CASE
        rows.append(
            Row(case, n, nbytes, "asyncio", name, us, baseline, baseline_us, samples.get(name, []))
        )
    return rows


def _measure_batched(plan: Plan, progress: Callable[[str], None]) -> list[Row]:
    n, leaves, leaf_bytes = 4, 1000, 1024
    rounds = plan.batch_rounds
    apart_rounds = max(2, rounds // 4)  # 1000 separate all_reduces: tens of ms a round
    progress(f"batched all_reduce: {leaves} x 1 KiB x {n} replicas ({rounds} rounds)")
    strategy = ar.MirroredStrategy(_devices(n))
    parts = [
        [np.full(leaf_bytes // 4, float(i), np.float32) for _ in range(leaves)] for i in range(n)
    ]
    batch = ar.PerReplica(parts)
    one = ar.PerReplica([np.full(leaves * leaf_bytes // 4, float(i), np.float32) for i in range(n)])

    def separate(rounds: int) -> Callable[[list[Array]], Coroutine[Any, Any, None]]:
        async def step(xs: list[Array]) -> None:
            ctx = ar.get_replica_context()
            assert ctx is not None
            for _ in range(rounds):
                for x in xs:  # every replica gets a list of the same length
                    await ctx.all_reduce(ar.ReduceOp.SUM, x)  # asyncreplica: ignore

        return step

    batched: list[float] = []
    single: list[float] = []
    apart: list[float] = []
    floor: list[float] = []
    for _ in range(plan.repeat):  # interleaved
        floor.append(_batch_floor(parts, rounds))
        # Rounds for each system such that a sample takes tens of milliseconds: the
        # steady time is a difference of two runs and must stand above their noise.
        batched.append(_steady(_ours("asyncio", strategy, "all_reduce", batch), rounds))
        single.append(_steady(_ours("asyncio", strategy, "all_reduce", one), 10 * rounds))
        apart.append(
            _steady(lambda r: _run_ours("asyncio", strategy, separate(r), batch), apart_rounds)
        )
    single_us = _median_us(single, 10 * rounds)
    batched_us = _median_us(batched, rounds)
    return [
        Row(
            "batched 1000 x 1 KiB",
            n,
            leaves * leaf_bytes,
            "asyncio",
            "asyncreplica",
            batched_us,
            "one all_reduce of 1000 KiB",
            single_us,
            batched,
        ),
        Row(
            "batched 1000 x 1 KiB",
            n,
            leaves * leaf_bytes,
            "-",
            "numpy, per leaf (floor)",
            _median_us(floor, rounds),
            "one all_reduce of 1000 KiB",
            single_us,
            floor,
        ),
        Row(
            "1000 separate 1 KiB",
            n,
            leaves * leaf_bytes,
            "asyncio",
            "asyncreplica",
            _median_us(apart, apart_rounds),
            "batched",
            batched_us,
            apart,
        ),
    ]


def _local_rendezvous_us(plan: Plan, replicas: int) -> float:
    """Microseconds per round of a bare futures rendezvous of ``replicas`` summing 8 B.

    The local part of the MPI floor for small values: each process of ``bench --mpi``
    runs ``replicas`` replicas, which must meet before MPI sees their sum.
    """
    inputs = _inputs(replicas, 8)
    rounds = 2000
    _futures(inputs)(1)  # untimed
    samples = [_steady(_futures(inputs), rounds) for _ in range(max(plan.repeat, 3))]
    return _median_us(samples, rounds)  # three samples at least: one may be within the noise
