"""``asyncreplica bench``: our collectives against baselines measured in the same run.

Every figure is a median over repeats, in microseconds per collective, next to its
baseline measured in the same process a moment before, so the ratio holds on whatever
machine runs it:

* ``futures``: a bare asyncio-futures rendezvous doing the same numpy sum (the last
  arrival sums in replica order and wakes one future per waiter);
* ``numpy floor``: the sum itself, in replica order, into one preallocated output
  (and, for large sizes, split over two threads);
* ``bytes floor`` for all_gather / broadcast / reduce_scatter: what must move at the
  least: a copy of each input into one output (all_gather), one copy of the source's
  input (broadcast), the sum of the inputs into one output (reduce_scatter); and the
  futures rendezvous doing that same work, which shows what any rendezvous adds;
* ``numpy, per leaf (floor)`` for the batched all_reduce: the least per-leaf work that
  gives each replica a read-only view per leaf (join, sum, views), with no rendezvous
  and no checks.

The targets table has a ``reference`` column: the same figure scored by the minimal
implementation (the futures rendezvous, or the per-leaf floor), measured in the run.
Where the reference itself misses a target, the target asks for less than the minimal
implementation costs on this machine.

Besides the timing table it measures the scale (per-replica cost of a small all_reduce
at 8 and 4096 replicas, run start-up excluded), the tracing overhead and memory (RSS
growth over 100,000 collectives, RSS of 10,000 replicas waiting at a collective), and
it prints every target of the performance issue with its measured value and whether it
is met (docs/performance.md).

Timings are noisy; the test suite runs ``--quick`` as a smoke test and asserts nothing
about the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

import asyncreplica as ar

__all__ = ["main"]

Array = npt.NDArray[Any]


@dataclass
class Row:
    """One measured case: a system's median against its baseline."""

    case: str
    replicas: int
    nbytes: int
    loop: str
    system: str
    median_us: float
    baseline: str
    baseline_us: float
    samples: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        """``median_us / baseline_us``."""
        return self.median_us / self.baseline_us if self.baseline_us else float("nan")


def _devices(n: int) -> list[str]:
    return [f"CPU:{i}" for i in range(n)]


def _inputs(n: int, nbytes: int) -> list[Array]:
    count = max(nbytes // 4, 1)
    return [np.full(count, float(i + 1), dtype=np.float32) for i in range(n)]


# -- baselines ------------------------------------------------------------------------


async def _futures_rendezvous(
    inputs: list[Array], rounds: int, work: Callable[[], Array] | None = None
) -> float:
    """A bare asyncio-futures rendezvous doing the same numpy sum (or ``work()``).

    The last arrival computes the result and wakes one future per waiter; every
    replica gets the same array.
    """
    n = len(inputs)
    loop = asyncio.get_running_loop()
    arrived = [0]
    waiters: list[asyncio.Future[Array]] = []

    async def all_reduce() -> Array:
        arrived[0] += 1
        if arrived[0] == n:
            if work is None:  # the sum inline: the baseline pays no extra call
                out = np.add(inputs[0], inputs[1]) if n > 1 else inputs[0].copy()
                for a in inputs[2:]:
                    np.add(out, a, out=out)
            else:
                out = work()
            for w in waiters:
                w.set_result(out)
            arrived[0] = 0
            waiters.clear()
            return out
        fut: asyncio.Future[Array] = loop.create_future()
        waiters.append(fut)
        return await fut

    async def replica() -> None:
        for _ in range(rounds):
            await all_reduce()

    start = time.perf_counter()
    await asyncio.gather(*(replica() for _ in range(n)))
    return time.perf_counter() - start


def _blocked_sum(
    inputs: list[Array], out: Array | None = None, lo: int = 0, hi: int | None = None
) -> Callable[[], Array]:
    """The sum in replica order into one preallocated output, in 256 KiB blocks.

    Walks elements ``lo:hi`` of the (flat) output block by block, so that the running
    sum stays in cache (the best floor measured here, reference/baselines.md).
    """
    if out is None:
        out = np.empty(inputs[0].size, inputs[0].dtype)
    flat = [a.reshape(-1) for a in inputs]
    step = max((256 << 10) // out.itemsize, 1)
    end = out.size if hi is None else hi

    def part() -> Array:
        for b in range(lo, end, step):
            e = min(b + step, end)
            block = out[b:e]
            if len(flat) > 1:
                np.add(flat[0][b:e], flat[1][b:e], out=block)
            else:
                block[...] = flat[0][b:e]
            for a in flat[2:]:
                np.add(block, a[b:e], out=block)
        return out

    part()  # untimed: the output's pages are touched once, as a reused buffer's are
    return part


def _numpy_floor(inputs: list[Array], rounds: int, threads: int = 1) -> float:
    """The sum in replica order into one preallocated output, cache-blocked.

    With several threads each walks its share of the output (see :func:`_blocked_sum`);
    the threads are started once, outside the timed rounds.
    """
    if threads == 1:
        return _timed(_blocked_sum(inputs), rounds)
    size = inputs[0].size
    bounds = [size * t // threads for t in range(threads + 1)]
    out = np.empty(size, inputs[0].dtype)
    parts = [_blocked_sum(inputs, out, bounds[t], bounds[t + 1]) for t in range(threads)]
    with ThreadPoolExecutor(max(threads - 1, 1)) as pool:
        start = time.perf_counter()
        for _ in range(rounds):
            others = [pool.submit(part) for part in parts[1:]]
            parts[0]()
            for f in others:
                f.result()
        return time.perf_counter() - start


def _copy_all(inputs: list[Array]) -> Callable[[], Array]:
    """One copy of each input into one preallocated output (what all_gather must move)."""
    out = np.empty(sum(a.size for a in inputs), dtype=inputs[0].dtype)
    out.fill(0)  # untimed: the output's pages are touched once, as a reused buffer's are

    def copy() -> Array:
        offset = 0
        for a in inputs:
            out[offset : offset + a.size] = a
            offset += a.size
        return out

    return copy


def _copy_one(inputs: list[Array]) -> Callable[[], Array]:
    """One copy of the first input into one preallocated output (what broadcast must move)."""
    out = np.empty_like(inputs[0])
    out.fill(0)

    def copy() -> Array:
        np.copyto(out, inputs[0])
        return out

    return copy


def _timed(work: Callable[[], object], rounds: int) -> float:
    """Seconds that ``rounds`` calls of ``work`` take."""
    start = time.perf_counter()
    for _ in range(rounds):
        work()
    return time.perf_counter() - start


def _batch_floor(batch: list[list[Array]], rounds: int) -> float:
    """The least per-leaf work of a batched all_reduce that gives each replica its views.

    Replica 0's leaves (1-D, one dtype and size) are joined into the output and each
    other replica's are written into one reused scratch buffer (one C call each), the
    scratch is added to the output in replica order, and every replica gets one
    read-only view per leaf (one C-level reshape and iteration), as the design's
    results are: no rendezvous, no description or check of the leaves.
    """
    n, m = len(batch), len(batch[0])
    dtype = batch[0][0].dtype
    size = batch[0][0].size
    scratch = io.BytesIO()

    def once() -> list[list[Array]]:
        out = np.frombuffer(bytearray().join(batch[0]), dtype)  # type: ignore[arg-type]
        for leaves in batch[1:]:
            scratch.seek(0)
            scratch.writelines(leaves)  # type: ignore[arg-type]
            with scratch.getbuffer() as buffer:
                other = np.frombuffer(buffer, dtype, m * size)
                np.add(out, other, out=out)
                del other  # releases the buffer, so the scratch can be written again
        out.flags.writeable = False
        rows = out.reshape(m, size)
        return [list(rows) for _ in range(n)]

    once()
    return _timed(once, rounds)


# -- ours -------------------------------------------------------------------------------


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


def _steady(sample: Callable[[int], float], rounds: int) -> float:
    """Seconds that ``rounds`` rounds take once running: ``sample(2R) - sample(R)``.

    ``sample(r)`` times a whole run of ``r`` rounds, which includes one-off costs
    (the event loop, the run's tasks, distributing its values); their difference
    leaves them out, so every per-round figure is the cost of a round, for ours and
    for the baselines alike.
    """
    short = sample(rounds)
    return max(sample(2 * rounds) - short, 1e-9)


def _ours(
    loop: str, strategy: ar.MirroredStrategy, kind: str, value: Any
) -> Callable[[int], float]:
    """``rounds -> seconds`` of a run of ``kind`` collectives (for :func:`_steady`)."""
    return lambda rounds: _run_ours(loop, strategy, _step(kind, rounds), value)


def _futures(
    inputs: list[Array], work: Callable[[], Array] | None = None
) -> Callable[[int], float]:
    """``rounds -> seconds`` of the bare futures rendezvous (for :func:`_steady`)."""
    return lambda rounds: asyncio.run(_futures_rendezvous(inputs, rounds, work))


def _median_us(samples: list[float], rounds: int) -> float:
    return statistics.median(samples) / rounds * 1e6


def _loops() -> list[str]:
    loops = ["asyncio"]
    for name in ("uvloop", "trio"):
        if importlib.util.find_spec(name) is not None:
            loops.append(name)
    return loops


# -- the plan -------------------------------------------------------------------------


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


@dataclass
class Target:
    """One target of the performance issue: its measured value and whether it is met."""

    figure: str
    value: float
    unit: str
    target: str
    met: bool
    # The same figure for the minimal implementation measured in this run (the futures
    # rendezvous doing the same work, or the numpy per-leaf floor of a batch): what the
    # target asks of ours, a design with no checks and no per-replica views already
    # scores. None where the baseline itself is that implementation.
    reference: float | None = None
    reference_system: str = ""


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


def _measure_scale(plan: Plan, progress: Callable[[str], None]) -> list[Row]:
    """Per-replica cost of a small all_reduce, run start-up excluded.

    Each system runs ``R`` and ``2 R`` rounds; the difference of the two (best of the
    repeats each) is the cost of ``R`` rounds without starting the run's tasks.
    """
    rows: list[Row] = []
    nbytes = 8
    for n in plan.many_replicas:
        inputs = _inputs(n, nbytes)
        rounds = max(4, 40_000 // n)
        progress(f"scale: all_reduce {nbytes} B x {n} replicas ({rounds} and {2 * rounds} rounds)")
        strategy = ar.MirroredStrategy(_devices(n))
        per_replica = ar.PerReplica(inputs)
        times: dict[tuple[str, int], list[float]] = {}
        for _ in range(plan.repeat):
            for r in (rounds, 2 * rounds):
                futures = asyncio.run(_futures_rendezvous(inputs, r))
                times.setdefault(("futures", r), []).append(futures)
                ours = _run_ours("asyncio", strategy, _step("all_reduce", r), per_replica)
                times.setdefault(("ours", r), []).append(ours)
        cost = {
            system: max(min(times[(system, 2 * rounds)]) - min(times[(system, rounds)]), 1e-9)
            / rounds
            / n
            * 1e6
            for system in ("ours", "futures")
        }
        rows.append(
            Row(
                "scale (per replica)",
                n,
                nbytes,
                "asyncio",
                "asyncreplica",
                cost["ours"],
                "futures, per replica",
                cost["futures"],
                times[("ours", rounds)],
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


# -- memory -----------------------------------------------------------------------------


def _rss() -> int:
    """The process's resident set size now, in bytes (Linux); its peak elsewhere."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)


def _idle_rss(idle: int) -> int:
    """RSS added by ``idle`` replicas all waiting at one collective (run it in a fresh process)."""
    gc.collect()
    before = _rss()
    during: list[int] = []

    def measure(strategy: ar.Strategy) -> None:
        during.append(_rss())  # every replica has arrived and waits

    async def wait() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        await ctx.merge_call(measure)

    asyncio.run(ar.MirroredStrategy(_devices(idle)).run(wait))
    return during[0] - before


def _measure_memory(plan: Plan, progress: Callable[[str], None]) -> list[Target]:
    """RSS growth over many collectives, and the RSS of many idle replicas."""
    targets: list[Target] = []
    total = plan.memory_collectives
    progress(f"memory: RSS over {total:,} all_reduces (8 B x 2 replicas)")
    marks: list[int] = []

    async def many(x: Array) -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        first = ctx.replica_id_in_sync_group == 0
        for i in range(total):
            if i == total // 10 and first:
                gc.collect()
                marks.append(_rss())
            await ctx.all_reduce(ar.ReduceOp.SUM, x)
        if first:
            gc.collect()
            marks.append(_rss())

    strategy = ar.MirroredStrategy(_devices(2))
    asyncio.run(strategy.run(many, args=(ar.PerReplica(_inputs(2, 8)),)))
    growth = (marks[1] - marks[0]) / (1 << 20)
    figure = f"RSS growth, collective {total // 10:,} to {total:,}"
    targets.append(Target(figure, growth, "MiB", "flat (< 1 MiB)", growth < 1.0))

    idle = plan.idle_replicas
    progress(f"memory: RSS of {idle:,} replicas waiting at a collective (fresh process)")
    # A fresh interpreter: this one's heap already holds the memory of earlier cases.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    code = f"from asyncreplica._bench import _idle_rss; print(_idle_rss({idle}))"
    found = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    mib = float(found.stdout.split()[-1]) / (1 << 20)
    limit = 200 * idle / 10_000  # MB
    goal = "< 200 MB" if idle == 10_000 else f"< {limit:g} MB (scaled)"
    figure = f"RSS added by {idle:,} replicas waiting"
    targets.append(Target(figure, mib, "MiB", goal, mib * (1 << 20) < limit * 1e6))
    return targets


# -- targets ------------------------------------------------------------------------------


def _find(
    rows: list[Row], case: str, n: int, nbytes: int, loop: str, system: str = "asyncreplica"
) -> Row | None:
    for r in rows:
        if (r.case, r.replicas, r.nbytes, r.loop, r.system) == (case, n, nbytes, loop, system):
            return r
    return None


def _targets(rows: list[Row]) -> list[Target]:
    """Every target of the issue that this run measured, with its value."""
    out: list[Target] = []
    small = _find(rows, "all_reduce", 8, 8, "asyncio")
    if small is not None:
        figure = "all_reduce 8 B x 8 vs futures rendezvous"
        out.append(Target(figure, small.ratio, "x", "<= 1.5x", small.ratio <= 1.5))
        uvloop = _find(rows, "all_reduce", 8, 8, "uvloop")
        if uvloop is not None:
            ratio = uvloop.median_us / small.median_us
            figure = "all_reduce 8 B x 8, uvloop vs asyncio"
            out.append(Target(figure, ratio, "x", "< 1x (faster)", ratio < 1.0))
        trio = _find(rows, "all_reduce", 8, 8, "trio")
        if trio is not None:
            ratio = trio.median_us / small.median_us
            figure = "all_reduce 8 B x 8, trio vs asyncio"
            out.append(Target(figure, ratio, "x", "<= 2x", ratio <= 2.0))
    large = _find(rows, "all_reduce", 8, 64 << 20, "asyncio")
    if large is not None:
        figure = "all_reduce 64 MiB x 8 vs best numpy floor"
        out.append(Target(figure, large.ratio, "x", "<= 1.15x", large.ratio <= 1.15))
    batched = _find(rows, "batched 1000 x 1 KiB", 4, 1000 * 1024, "asyncio")
    if batched is not None:
        figure = "batched 1000 x 1 KiB x 4 vs one 1000 KiB"
        floor = _find(rows, "batched 1000 x 1 KiB", 4, 1000 * 1024, "-", "numpy, per leaf (floor)")
        out.append(
            Target(
                figure,
                batched.ratio,
                "x",
                "<= 5x",
                batched.ratio <= 5.0,
                None if floor is None else floor.ratio,
                "" if floor is None else "numpy per leaf",
            )
        )
    apart = _find(rows, "1000 separate 1 KiB", 4, 1000 * 1024, "asyncio")
    if apart is not None:
        figure = "1000 separate all_reduces vs batched"
        out.append(Target(figure, apart.ratio, "x slower", ">= 10x", apart.ratio >= 10.0))
    scale = sorted((r for r in rows if r.case == "scale (per replica)"), key=lambda r: r.replicas)
    if len(scale) >= 2:
        ratio = scale[-1].median_us / scale[0].median_us
        # The futures rendezvous's own growth (its per-replica cost is each row's baseline).
        futures = scale[-1].baseline_us / scale[0].baseline_us
        figure = f"per-replica cost, {scale[-1].replicas} vs {scale[0].replicas} replicas"
        out.append(Target(figure, ratio, "x", "<= 1.5x", ratio <= 1.5, futures, "futures"))
    for r in rows:
        if r.case in _MOVES and r.system == "asyncreplica":
            figure = f"{r.case} {_size(r.nbytes)} x {r.replicas} vs bytes floor"
            bare = _find(rows, r.case, r.replicas, r.nbytes, r.loop, "futures")
            reference = None if bare is None else bare.ratio
            out.append(
                Target(figure, r.ratio, "x", "<= 1.2x", r.ratio <= 1.2, reference, "futures")
            )
    for r in rows:
        if r.case == "tracing on":
            out.append(Target("tracing on vs off, 8 B x 8", r.ratio, "x", "(reported)", True))
    return out


# -- output ---------------------------------------------------------------------------


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _table(rows: list[Row]) -> str:
    header = (
        f"{'case':<22}{'N':>6}{'size':>10}  {'loop':<8}{'system':<24}{'median':>12}  "
        f"{'baseline':<29}{'ratio':>7}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.case:<22}{r.replicas:>6}{_size(r.nbytes):>10}  {r.loop:<8}{r.system:<24}"
            f"{r.median_us:>10.1f}us  {r.baseline:<29}{r.ratio:>6.2f}x"
        )
    return "\n".join(lines)


def _targets_table(targets: list[Target]) -> str:
    header = f"{'target':<48}{'measured':>16}  {'goal':<20}{'met':<5}{'reference':>24}"
    lines = [header, "-" * len(header)]
    for t in targets:
        value = f"{t.value:.2f} {t.unit}"
        reference = "" if t.reference is None else f"{t.reference:.2f} x {t.reference_system}"
        met = "yes" if t.met else "NO"
        line = f"{t.figure:<48}{value:>16}  {t.target:<20}{met:<5}{reference:>24}"
        lines.append(line.rstrip())
    lines.append(
        "reference: the same figure for a minimal implementation measured in this run: the "
        "bare futures\nrendezvous doing the same work (every replica gets the same array), "
        "or the numpy per-leaf floor of the batch\n(join, sum, one read-only view per leaf "
        "and replica; no rendezvous, no checks)"
    )
    return "\n".join(lines)


def _plot(rows: list[Row], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.5))
    reduce_rows = [r for r in rows if r.case == "all_reduce"]
    if reduce_rows:
        n = max(r.replicas for r in reduce_rows if r.replicas <= 8)
        series: dict[str, list[tuple[int, float]]] = {}
        for r in reduce_rows:
            if r.replicas == n:
                label = f"asyncreplica ({r.loop})" if r.system == "asyncreplica" else r.system
                series.setdefault(label, []).append((r.nbytes, r.median_us))
        for label, points in sorted(series.items()):
            points.sort()
            left.loglog([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        left.set_title(f"all_reduce, {n} replicas: median time vs size")
        left.set_xlabel("bytes per replica")
        left.set_ylabel("µs per all_reduce")
        left.legend(fontsize=8)
        left.grid(True, which="both", alpha=0.3)
    ours = [r for r in rows if r.system.startswith("asyncreplica") and r.baseline_us > 0]
    ours = [r for r in ours if r.case != "all_reduce" or r.loop == "asyncio"]
    ours = [r for r in ours if r.case != "run start-up"]  # a one-off cost, not a ratio
    if ours:
        names = [f"{r.case} {_size(r.nbytes)} x{r.replicas}" for r in ours]
        right.barh(names, [r.ratio for r in ours], color="tab:blue")
        right.axvline(1.0, color="black", linewidth=0.8)
        right.set_xscale("log")
        right.set_title("ratio to the baseline measured in the same run")
        right.set_xlabel("ratio (lower is better; see the table for each baseline)")
        right.tick_params(axis="y", labelsize=7)
        right.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _machine() -> dict[str, object]:
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loops": _loops(),
    }


def _measure_mpi(quick: bool, progress: Callable[[str], None]) -> dict[str, Any] | None:
    """Our cross-process all_reduce against raw mpi4py, when the [mpi] extra is installed.

    Runs ``asyncreplica bench --mpi`` (2 processes x 4 replicas, under mpiexec) and
    returns its printed table and its JSON report; None, with a progress line saying
    why, when MPI is not available.
    """
    from ._launch import find_mpiexec, launched_by_mpiexec

    mpiexec = find_mpiexec()
    if importlib.util.find_spec("mpi4py") is None or mpiexec is None:
        progress("mpi4py or mpiexec not installed: no MPI comparison (the [mpi] extra)")
        return None
    if launched_by_mpiexec():
        progress("already under mpiexec: run `asyncreplica bench --mpi` for the MPI comparison")
        return None
    progress("mpi4py: cross-process all_reduce vs raw Allreduce (2 processes x 4 replicas)")
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "mpi.json")
        command = [sys.executable, "-m", "asyncreplica", "bench", "--mpi", "--json", out]
        if quick:
            command.append("--quick")
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
        except subprocess.TimeoutExpired:
            progress("the MPI comparison did not finish in 10 minutes; skipped")
            return None
        if done.returncode != 0 or not os.path.exists(out):
            progress(f"the MPI comparison failed: {done.stderr.strip()[-300:]}")
            return None
        with open(out, encoding="utf-8") as f:
            report = json.load(f)
    return {"table": done.stdout.strip(), "report": report}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the tables; write JSON and a chart when asked.

    Args:
        argv: Command-line arguments (without the program name).

    Returns:
        The exit status: 0, or 2 for a usage error.
    """
    parser = argparse.ArgumentParser(
        prog="asyncreplica bench",
        description="Measure asyncreplica's collectives against baselines measured in the same run.",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run in well under a minute")
    parser.add_argument("--json", metavar="FILE", help="write every measurement as JSON")
    parser.add_argument("--plot", metavar="FILE", help="write a PNG chart (needs matplotlib)")
    parser.add_argument("--repeat", type=int, help="timing samples per case (median reported)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    if args.repeat is not None and args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print(
            "asyncreplica bench: error: --plot needs matplotlib: pip install matplotlib",
            file=sys.stderr,
        )
        return 2
    if args.quick:
        plan = Plan(
            [8, 1 << 20],
            [8],
            [8, 256],
            _loops(),
            args.repeat or 3,
            8 << 20,
            batch_rounds=5,
            memory_collectives=10_000,
            idle_replicas=1000,
        )
    else:
        plan = Plan(
            [8, 4096, 1 << 20, 64 << 20],
            [2, 8, 64],
            [8, 64, 4096],
            _loops(),
            args.repeat or 5,
            256 << 20,
            move_sizes=[64 << 10, 1 << 20, 16 << 20],
        )
    started = time.perf_counter()

    def progress(text: str) -> None:
        if not args.quiet:
            print(f"[{time.perf_counter() - started:6.1f} s] {text}", file=sys.stderr, flush=True)

    rows = _measure_all_reduce(plan, progress)
    rows += _measure_scale(plan, progress)
    rows += _measure_moves(plan, progress)
    rows += _measure_batched(plan, progress)
    rows += _measure_tracing(plan, progress)
    targets = _targets(rows) + _measure_memory(plan, progress)
    mpi = _measure_mpi(args.quick, progress)
    print(_table(rows))
    print()
    print(_targets_table(targets))
    if mpi is not None:
        print()
        print(mpi["table"])
    if args.json:
        report = {
            "machine": _machine(),
            "quick": args.quick,
            "rows": [{**asdict(r), "ratio": r.ratio} for r in rows],
            "targets": [asdict(t) for t in targets],
            "mpi": None if mpi is None else mpi["report"],
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    if args.plot:
        _plot(rows, args.plot)
    progress("done")
    return 0
