"""Instructions and last-level cache misses per replica-round, for cachegrind.

Runs ROUNDS rounds of a small ``all_reduce(SUM)`` (2 x float32) across REPLICAS replicas
on LOOP (asyncio, uvloop or trio), ours or (``--bare``) the bare rendezvous on that
loop's own primitives (``asyncreplica._tools._bench._baselines._rendezvous``: asyncio futures,
or trio's ``wait_task_rescheduled``). Run it twice under cachegrind with the cache
simulation and different round counts; the difference of the totals over the
difference of the replica-rounds is the cost of one replica-round, start-up excluded::

    for r in 2 4; do valgrind --tool=cachegrind --cache-sim=yes --LL=2097152,16,64 \\
        --cachegrind-out-file=/tmp/cg.$r python benchmarks/callgrind_scale.py trio 4096 $r
    done
    # per replica-round = (total(4) - total(2)) / (2 * 4096), for "I refs" and "LL misses"

``--summary`` runs the pairs itself and prints one line per (loop, system, replicas):
``python benchmarks/callgrind_scale.py --summary [--loops ...] [--replicas 8 64 4096]
[--systems ours bare] [--jobs 2]``. The cache simulated is this machine's L1 and a 2 MiB
last level (``--ll`` bytes).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# The caches simulated: this machine's L1, and a 2 MiB last level (its two 1 MiB L2
# caches; what does not fit there is fetched from L3 or memory). valgrind reads a 256 MiB
# direct-mapped L3 from the virtual CPU, which is not the hardware. ``--ll`` sets another.
_L1 = ["--I1=32768,8,64", "--D1=32768,8,64"]
_LL = 2 << 20

# The script each measured run executes (a variant may wrap this one).
_SCRIPT = __file__

# Replica-rounds per run of the shorter pair (the longer runs twice as many).
_BUDGET = 8_192


def _run(loop: str, replicas: int, rounds: int, bare: bool) -> None:
    import asyncreplica as ar
    from asyncreplica._tools._bench._baselines import _rendezvous
    from asyncreplica._tools._bench._cases import _run_ours, _step

    inputs = [np.full(2, float(i + 1), np.float32) for i in range(replicas)]
    if bare:
        _rendezvous(loop, inputs, rounds)
        return
    strategy = ar.MirroredStrategy([f"CPU:{i}" for i in range(replicas)])
    _run_ours(loop, strategy, _step("all_reduce", rounds), ar.PerReplica(inputs))


def _totals(args: list[str], ll: int = _LL) -> tuple[int, int, int]:
    """Instructions, D1 misses and LL misses (instructions and data) of one run."""
    with tempfile.NamedTemporaryFile(suffix=".cg") as out:
        done = subprocess.run(
            [
                "valgrind",
                "--tool=cachegrind",
                "--cache-sim=yes",
                *_L1,
                f"--LL={ll},16,64",
                f"--cachegrind-out-file={out.name}",
                sys.executable,
                _SCRIPT,
                *args,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")

    def total(name: str) -> int:
        found = re.search(rf"==\d+== {name}:\s+([\d,]+)", done.stderr)
        assert found is not None, done.stderr[-2000:]
        return int(found.group(1).replace(",", ""))

    return total(r"I\s+refs"), total(r"D1\s+misses"), total(r"LL misses")


def _summary(loops: list[str], replicas: list[int], systems: list[str], ll: int, jobs: int) -> None:
    print(f"last level: {ll >> 10} KiB", flush=True)
    print(
        f"{'loop':<8}{'system':<8}{'N':>6}{'instr':>10}{'D1 miss':>10}{'LL miss':>10}"
        "  per replica-round",
        flush=True,
    )
    cases = [(loop, system, n) for loop in loops for system in systems for n in replicas]

    def measure(case: tuple[str, str, int]) -> str:
        loop, system, n = case
        rounds = max(2, _BUDGET // n)
        extra = ["--bare"] if system == "bare" else []
        short = _totals([loop, str(n), str(rounds), *extra], ll)
        long = _totals([loop, str(n), str(2 * rounds), *extra], ll)
        per = [(b - a) / (rounds * n) for a, b in zip(short, long, strict=True)]
        return f"{loop:<8}{system:<8}{n:>6}{per[0]:>10,.0f}{per[1]:>10.1f}{per[2]:>10.1f}"

    with ThreadPoolExecutor(jobs) as pool:
        for line in pool.map(measure, cases):
            print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summary", action="store_true")
    parser.add_argument("--loops", nargs="+", default=["asyncio", "uvloop", "trio"])
    parser.add_argument("--replicas", type=int, nargs="+", default=[8, 64, 4096])
    parser.add_argument("--systems", nargs="+", default=["ours", "bare"])
    parser.add_argument("--bare", action="store_true")
    parser.add_argument("--ll", type=int, default=_LL, help="last-level cache bytes")
    parser.add_argument("--jobs", type=int, default=1, help="runs under cachegrind at once")
    parser.add_argument("args", nargs="*", help="LOOP REPLICAS ROUNDS (one run)")
    ns = parser.parse_args()
    if ns.summary:
        _summary(ns.loops, ns.replicas, ns.systems, ns.ll, ns.jobs)
        return
    loop, replicas, rounds = ns.args
    _run(loop, int(replicas), int(rounds), ns.bare)


if __name__ == "__main__":
    main()
