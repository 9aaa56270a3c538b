"""``asyncreplica bench``: our collectives against baselines measured in the same run.

Every figure is a median over repeats, in microseconds per collective, next to its
baseline measured in the same process a moment before, so the ratio holds on whatever
machine runs it:

* ``futures``: a bare asyncio-futures rendezvous doing the same numpy sum (the last
  arrival sums in replica order and wakes one future per waiter);
* ``numpy floor``: the sum itself, in replica order, into one preallocated output
  (and, for large sizes, split over two threads);
* ``bytes floor`` for all_gather / broadcast / reduce_scatter: one copy of each input
  into one output;
* ``mpi4py``: MPI ``Allreduce`` under ``mpiexec`` when the ``[mpi]`` extra is installed.

Timings are noisy; the test suite runs ``--quick`` as a smoke test and asserts nothing
about the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import statistics
import sys
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


async def _futures_rendezvous(inputs: list[Array], rounds: int) -> float:
    """A bare asyncio-futures rendezvous doing the same numpy sum."""
    n = len(inputs)
    loop = asyncio.get_running_loop()
    arrived = [0]
    waiters: list[asyncio.Future[Array]] = []

    async def all_reduce() -> Array:
        arrived[0] += 1
        if arrived[0] == n:
            out = np.add(inputs[0], inputs[1]) if n > 1 else inputs[0].copy()
            for a in inputs[2:]:
                np.add(out, a, out=out)
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


def _numpy_floor(inputs: list[Array], rounds: int, threads: int = 1) -> float:
    """The sum in replica order into one preallocated output, cache-blocked.

    Each thread walks its share of the output in 256 KiB blocks so that the running
    sum stays in cache (the best floor measured here, reference/baselines.md); the
    threads are started once, outside the timed rounds.
    """
    out = np.empty_like(inputs[0]).reshape(-1)
    flat = [a.reshape(-1) for a in inputs]
    size = out.size
    step = max((256 << 10) // out.itemsize, 1)

    def part(lo: int, hi: int) -> None:
        for b in range(lo, hi, step):
            e = min(b + step, hi)
            block = out[b:e]
            if len(flat) > 1:
                np.add(flat[0][b:e], flat[1][b:e], out=block)
            else:
                block[...] = flat[0][b:e]
            for a in flat[2:]:
                np.add(block, a[b:e], out=block)

    bounds = [size * t // threads for t in range(threads + 1)]
    with ThreadPoolExecutor(max(threads - 1, 1)) as pool:
        start = time.perf_counter()
        for _ in range(rounds):
            others = [pool.submit(part, bounds[t], bounds[t + 1]) for t in range(1, threads)]
            part(bounds[0], bounds[1])
            for f in others:
                f.result()
        return time.perf_counter() - start


def _bytes_floor(inputs: list[Array], rounds: int) -> float:
    """One copy of each input into one output (what all_gather must move)."""
    out = np.empty(sum(a.size for a in inputs), dtype=inputs[0].dtype)
    start = time.perf_counter()
    for _ in range(rounds):
        offset = 0
        for a in inputs:
            out[offset : offset + a.size] = a
            offset += a.size
    return time.perf_counter() - start


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


def _rounds(plan: Plan, nbytes: int, n: int) -> int:
    return int(min(2000, max(2, plan.budget_bytes // max(nbytes * n, 1))))


def _measure_all_reduce(plan: Plan, progress: Callable[[str], None]) -> list[Row]:
    rows: list[Row] = []
    for n in plan.replicas:
        for nbytes in plan.sizes:
            inputs = _inputs(n, nbytes)
            rounds = _rounds(plan, nbytes, n)
            progress(f"all_reduce {nbytes} B x {n} replicas ({rounds} rounds)")
            base = [asyncio.run(_futures_rendezvous(inputs, rounds)) for _ in range(plan.repeat)]
            floor1 = [_numpy_floor(inputs, rounds) for _ in range(plan.repeat)]
            base_us = _median_us(base, rounds)
            floor_us = _median_us(floor1, rounds)
            floors = {"numpy floor (1 thread)": floor_us}
            if nbytes >= 1 << 20:
                floor2 = [_numpy_floor(inputs, rounds, threads=2) for _ in range(plan.repeat)]
                floors["numpy floor (2 threads)"] = _median_us(floor2, rounds)
            best_floor = min(floors.items(), key=lambda kv: kv[1])
            strategy = ar.MirroredStrategy(_devices(n))
            per_replica = ar.PerReplica(inputs)
            for loop in plan.loops:
                samples = [
                    _run_ours(loop, strategy, _step("all_reduce", rounds), per_replica)
                    for _ in range(plan.repeat)
                ]
                us = _median_us(samples, rounds)
                baseline = ("futures", base_us) if nbytes < 1 << 20 else best_floor
                rows.append(
                    Row(
                        "all_reduce",
                        n,
                        nbytes,
                        loop,
                        "asyncreplica",
                        us,
                        baseline[0],
                        baseline[1],
                        samples,
                    )
                )
            rows.append(
                Row(
                    "all_reduce",
                    n,
                    nbytes,
                    "asyncio",
                    "futures",
                    base_us,
                    best_floor[0],
                    best_floor[1],
                    base,
                )
            )
            for name, value in floors.items():
                rows.append(
                    Row("all_reduce", n, nbytes, "-", name, value, best_floor[0], best_floor[1])
                )
    for n in plan.many_replicas:
        nbytes = 8
        inputs = _inputs(n, nbytes)
        rounds = max(3, 20_000 // n)
        progress(f"all_reduce {nbytes} B x {n} replicas ({rounds} rounds)")
        strategy = ar.MirroredStrategy(_devices(n))
        base = [asyncio.run(_futures_rendezvous(inputs, rounds)) for _ in range(plan.repeat)]
        samples = [
            _run_ours("asyncio", strategy, _step("all_reduce", rounds), ar.PerReplica(inputs))
            for _ in range(plan.repeat)
        ]
        rows.append(
            Row(
                "all_reduce (scale)",
                n,
                nbytes,
                "asyncio",
                "asyncreplica",
                _median_us(samples, rounds) / n,
                "futures, per replica",
                _median_us(base, rounds) / n,
                samples,
            )
        )
    return rows


def _measure_moves(plan: Plan, progress: Callable[[str], None]) -> list[Row]:
    rows: list[Row] = []
    n, nbytes = 8, 1 << 20
    inputs = _inputs(n, nbytes)
    rounds = _rounds(plan, nbytes, n)
    strategy = ar.MirroredStrategy(_devices(n))
    floor = _median_us([_bytes_floor(inputs, rounds) for _ in range(plan.repeat)], rounds)
    for kind in ("all_gather", "broadcast", "reduce_scatter"):
        progress(f"{kind} {nbytes} B x {n} replicas")
        samples = [
            _run_ours("asyncio", strategy, _step(kind, rounds), ar.PerReplica(inputs))
            for _ in range(plan.repeat)
        ]
        base = floor if kind == "all_gather" else floor / n
        rows.append(
            Row(
                kind,
                n,
                nbytes,
                "asyncio",
                "asyncreplica",
                _median_us(samples, rounds),
                "bytes floor",
                base,
                samples,
            )
        )
    return rows


def _measure_batched(plan: Plan, progress: Callable[[str], None]) -> list[Row]:
    n, leaves, leaf_bytes = 4, 1000, 1024
    progress(f"batched all_reduce: {leaves} x {leaf_bytes} B x {n} replicas")
    strategy = ar.MirroredStrategy(_devices(n))
    rounds = 5
    batch = ar.PerReplica(
        [[np.full(leaf_bytes // 4, float(i), np.float32) for _ in range(leaves)] for i in range(n)]
    )
    one = ar.PerReplica([np.full(leaves * leaf_bytes // 4, float(i), np.float32) for i in range(n)])

    async def separate(xs: list[Array]) -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        for _ in range(rounds):
            for x in xs:  # every replica gets a list of the same length
                await ctx.all_reduce(ar.ReduceOp.SUM, x)  # asyncreplica: ignore

    batched = [
        _run_ours("asyncio", strategy, _step("all_reduce", rounds), batch)
        for _ in range(plan.repeat)
    ]
    single = [
        _run_ours("asyncio", strategy, _step("all_reduce", rounds), one) for _ in range(plan.repeat)
    ]
    apart = [_run_ours("asyncio", strategy, separate, batch) for _ in range(plan.repeat)]
    single_us = _median_us(single, rounds)
    return [
        Row(
            "batched 1000 x 1 KiB",
            n,
            leaves * leaf_bytes,
            "asyncio",
            "asyncreplica",
            _median_us(batched, rounds),
            "one all_reduce of 1000 KiB",
            single_us,
            batched,
        ),
        Row(
            "1000 separate 1 KiB",
            n,
            leaves * leaf_bytes,
            "asyncio",
            "asyncreplica",
            _median_us(apart, rounds),
            "batched",
            _median_us(batched, rounds),
            apart,
        ),
    ]


def _measure_mpi(progress: Callable[[str], None]) -> list[Row]:
    if importlib.util.find_spec("mpi4py") is None:
        progress("mpi4py: not installed (pip install 'asyncreplica[mpi]'); skipped")
        return []
    progress("mpi4py: cross-process all_reduce is measured by `bench --mpi` (issue 5); skipped")
    return []


# -- output ---------------------------------------------------------------------------


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _table(rows: list[Row]) -> str:
    header = f"{'case':<22}{'N':>6}{'size':>10}  {'loop':<8}{'system':<24}{'median':>12}  {'baseline':<26}{'ratio':>7}"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.case:<22}{r.replicas:>6}{_size(r.nbytes):>10}  {r.loop:<8}{r.system:<24}"
            f"{r.median_us:>10.1f}us  {r.baseline:<26}{r.ratio:>6.2f}x"
        )
    return "\n".join(lines)


def _plot(rows: list[Row], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r.case == "all_reduce" and r.replicas == max(
            x.replicas for x in rows if x.case == "all_reduce"
        ):
            label = r.system if r.loop in ("-", "asyncio") else f"{r.system} ({r.loop})"
            if r.system == "asyncreplica":
                label = f"asyncreplica ({r.loop})"
            series.setdefault(label, []).append((r.nbytes, r.median_us))
    for label, points in sorted(series.items()):
        points.sort()
        ax.loglog([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    ax.set_xlabel("bytes per replica")
    ax.set_ylabel("µs per all_reduce (median)")
    ax.set_title("all_reduce time vs size")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table; write JSON and a chart when asked.

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
        plan = Plan([8, 4096, 1 << 20], [2, 8], [], _loops(), args.repeat or 3, 8 << 20)
    else:
        plan = Plan(
            [8, 4096, 1 << 20, 64 << 20],
            [2, 8, 64],
            [8, 4096],
            _loops(),
            args.repeat or 5,
            256 << 20,
        )
    started = time.perf_counter()

    def progress(text: str) -> None:
        if not args.quiet:
            print(f"[{time.perf_counter() - started:6.1f} s] {text}", file=sys.stderr, flush=True)

    rows = _measure_all_reduce(plan, progress)
    rows += _measure_moves(plan, progress)
    if not args.quick:
        rows += _measure_batched(plan, progress)
    rows += _measure_mpi(progress)
    print(_table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([{**asdict(r), "ratio": r.ratio} for r in rows], f, indent=1)
    if args.plot:
        _plot(rows, args.plot)
    progress("done")
    return 0
