"""``asyncreplica bench --mpi``: our cross-process all_reduce against raw mpi4py, in one run.

Launched as ``mpiexec -n P python -m asyncreplica bench --mpi`` (``asyncreplica bench
--mpi`` relaunches itself so). Each process runs ``--replicas`` replicas of a
:class:`~asyncreplica.MultiWorkerMirroredStrategy`; for each message size it times, in
the same processes and interleaved:

* ``ours``: one ``ctx.all_reduce(SUM)`` of a float32 array of that size per replica,
  every check on (local ledger, cross-process agreement), inside one ``strategy.run``;
* ``raw``: ``comm.Allreduce`` of the same per-process buffer with mpi4py (blocking, on
  a duplicate of COMM_WORLD): what MPI alone costs;
* ``checks``: ``ctx.barrier()``, which moves no data: the local rendezvous plus the
  processes' agreement exchange, i.e. what the checks cost on top of the data;
* ``local``: the local reduction alone, with plain numpy: the process's ``--replicas``
  inputs of that size (one array each, as ours gets) summed in replica order into one
  preallocated output, in cache-sized blocks: what ours does before MPI sees the data,
  and raw MPI does not do at all.

Medians of ``--repeat`` samples of ``--rounds`` collectives each; rank 0 prints the
table (``ours / raw`` and ``ours - raw`` in microseconds, the local sum, and
``floor / raw`` = ``(local + raw) / raw``: the least ``ours / raw`` a hierarchical
all_reduce can reach when the local sum and the transfer cannot overlap) and writes
``--json``.
Unlike the library runtime, this module imports numpy and mpi4py: it is a program.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import anyio
import numpy as np

import asyncreplica as ar

from ._bench import _blocked_sum, _timed

__all__ = ["SIZES", "main", "measure"]

#: Message sizes in bytes (float32 elements x 4).
SIZES = (8, 1024, 64 * 1024, 1 << 20, 16 << 20)
QUICK_SIZES = (8, 1 << 20)


def _rounds_for(size: int, rounds: int) -> int:
    # Fewer rounds for large messages: each takes milliseconds.
    return max(3, min(rounds, (64 << 20) // max(size, 1) // 4)) if size >= (1 << 20) else rounds


async def _time_ours(
    strategy: ar.MultiWorkerMirroredStrategy, inputs: list[np.ndarray[Any, Any]], rounds: int
) -> float:
    async def step(value: np.ndarray[Any, Any]) -> float:
        ctx = ar.get_replica_context()
        assert ctx is not None
        await ctx.all_reduce("SUM", value)  # warm-up: caches, buffers
        start = time.perf_counter()
        for _ in range(rounds):
            await ctx.all_reduce("SUM", value)
        return (time.perf_counter() - start) / rounds

    # Each local replica its own input, as the local floor's (one shared array would be
    # read from memory once by a cache-blocked sum, not once per replica).
    result = await strategy.run(step, args=(ar.PerReplica(inputs),))
    return float(max(strategy.experimental_local_results(result)))


async def _time_checks(strategy: ar.MultiWorkerMirroredStrategy, rounds: int) -> float:
    async def step() -> float:
        ctx = ar.get_replica_context()
        assert ctx is not None
        await ctx.barrier()
        start = time.perf_counter()
        for _ in range(rounds):
            await ctx.barrier()
        return (time.perf_counter() - start) / rounds

    result = await strategy.run(step)
    return float(max(strategy.experimental_local_results(result)))


def _time_raw(comm: Any, value: np.ndarray[Any, Any], rounds: int) -> float:
    out = np.empty_like(value)
    comm.Allreduce(value, out)
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(rounds):
        comm.Allreduce(value, out)
    return (time.perf_counter() - start) / rounds


def _time_local(inputs: list[np.ndarray[Any, Any]], rounds: int) -> float:
    # The best local reduction numpy does here: the sum in replica order into one
    # preallocated output, in cache-sized blocks (a copy for one replica).
    return _timed(_blocked_sum(inputs), rounds) / rounds


async def measure(
    sizes: tuple[int, ...], replicas: int, rounds: int, repeat: int
) -> list[dict[str, Any]]:
    """Time ours, raw, checks and local for each size; every process returns the same rows.

    Args:
        sizes: Message sizes in bytes (per replica; float32).
        replicas: Replicas per process.
        rounds: Collectives per timing sample (fewer for large messages).
        repeat: Timing samples per case; the median is reported.

    Returns:
        One row per size: ``size``, ``ours_s``, ``raw_s``, ``checks_s``, ``ratio``,
        ``extra_us``, ``local_s`` (the local numpy sum alone) and ``floor_ratio``
        (``(local_s + raw_s) / raw_s``).
    """
    from mpi4py import MPI

    comm = MPI.COMM_WORLD.Dup()
    strategy = ar.MultiWorkerMirroredStrategy([f"CPU:{i}" for i in range(replicas)])
    rows = []
    for size in sizes:
        count = max(size // 4, 1)
        value = np.ones(count, np.float32)
        inputs = [np.full(count, i + 1, np.float32) for i in range(replicas)]
        n = _rounds_for(size, rounds)
        ours: list[float] = []
        raw: list[float] = []
        checks: list[float] = []
        summed: list[float] = []
        for _ in range(repeat):
            ours.append(await _time_ours(strategy, inputs, n))
            raw.append(_time_raw(comm, value, n))
            checks.append(await _time_checks(strategy, n))
            summed.append(_time_local(inputs, n))
        # The slowest process sets the pace: agree on the maxima of the medians.
        local = np.array([statistics.median(x) for x in (ours, raw, checks, summed)])
        worst = np.empty_like(local)
        comm.Allreduce(local, worst, op=MPI.MAX)
        o, r, c, s = (float(v) for v in worst)
        rows.append(
            {
                "size": size,
                "ours_s": o,
                "raw_s": r,
                "checks_s": c,
                "ratio": o / r,
                "extra_us": (o - r) * 1e6,
                "local_s": s,
                "floor_ratio": (s + r) / r,
            }
        )
        if comm.Get_rank() == 0:
            print(f"  measured {_size(size)}", file=sys.stderr, flush=True)
    comm.Free()
    return rows


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n // scale} {unit}"
    return f"{n} B"


def table(rows: list[dict[str, Any]], processes: int, replicas: int) -> str:
    """The printed report."""
    lines = [
        (
            f"all_reduce(SUM) float32 across {processes} MPI processes x {replicas} replicas "
            "(medians; every check on)"
        ),
        (
            f"{'size':>8}  {'ours':>10}  {'raw MPI':>10}  {'ours/raw':>8}  {'ours-raw':>10}  "
            f"{'checks':>10}  {'local sum':>10}  {'floor/raw':>9}"
        ),
    ]
    for row in rows:
        lines.append(
            f"{_size(row['size']):>8}  {row['ours_s'] * 1e6:>8.1f}us  {row['raw_s'] * 1e6:>8.1f}us"
            f"  {row['ratio']:>7.2f}x  {row['extra_us']:>8.1f}us  {row['checks_s'] * 1e6:>8.1f}us"
            f"  {row['local_s'] * 1e6:>8.1f}us  {row['floor_ratio']:>8.2f}x"
        )
    lines.append(
        "raw MPI: mpi4py comm.Allreduce of the same per-process buffer; checks: ctx.barrier() "
        "(local rendezvous + cross-process agreement, no data)"
    )
    lines.append(
        f"local sum: numpy sum of the process's {replicas} inputs in replica order into one "
        "preallocated output, cache-blocked; floor/raw: (local sum + raw) / raw, the least "
        "ours/raw without overlapping the two"
    )
    return "\n".join(lines)


def faults_main(argv: list[str], mpiexec: str, processes: int) -> int:
    """After the all_reduce jobs (not under mpiexec): measure and print the fault latencies.

    Each kind of fault is its own ``mpiexec`` job (see :mod:`._bench_mpi_faults`); with
    ``--json``, the rows are added to the report rank 0 wrote, as ``faults``.
    """
    from . import _bench_mpi_faults as faults

    args = _parser().parse_args(argv)
    if args.no_faults:
        return 0
    repeat = 1 if args.quick else 3

    def progress(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    progress(f"  measuring fault latencies ({len(faults.KINDS)} kinds x {repeat} jobs)")
    rows = faults.measure(mpiexec, max(processes, 2), repeat, progress)
    print()
    print(faults.table(rows))
    if args.json:
        with open(args.json, encoding="utf-8") as f:
            report = json.load(f)
        report["faults"] = rows
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asyncreplica bench --mpi",
        description="cross-process all_reduce vs raw mpi4py Allreduce, measured in one run",
    )
    parser.add_argument("--quick", action="store_true", help="two sizes, few rounds")
    parser.add_argument("--json", metavar="FILE", help="write the measurements as JSON")
    parser.add_argument("--replicas", type=int, default=4, help="replicas per process")
    parser.add_argument("--rounds", type=int, default=200, help="collectives per sample")
    parser.add_argument("--repeat", type=int, default=5, help="samples per case")
    parser.add_argument("--processes", type=int, default=2, help="for the relaunch")
    parser.add_argument(
        "--no-faults",
        action="store_true",
        help="skip the fault latencies (one mpiexec job per kind of fault, after the table)",
    )
    return parser


def main(argv: list[str]) -> int:
    """Run the MPI benchmark (under mpiexec); return the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.replicas < 1 or args.rounds < 1 or args.repeat < 1:
        parser.error("--replicas, --rounds and --repeat must be positive")
    sizes = QUICK_SIZES if args.quick else SIZES
    rounds = min(args.rounds, 20) if args.quick else args.rounds
    repeat = min(args.repeat, 3) if args.quick else args.repeat

    async def run() -> list[dict[str, Any]]:
        return await measure(sizes, args.replicas, rounds, repeat)

    rows = anyio.run(run)
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() == 0:
        processes = MPI.COMM_WORLD.Get_size()
        print(table(rows, processes, args.replicas))
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(
                    {"processes": processes, "replicas": args.replicas, "rows": rows}, f, indent=2
                )
    return 0
