"""The command line: ``asyncreplica bench``."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from ._cases import (
    Plan,
    _local_rendezvous_us,
    _loops,
    _measure_all_reduce,
    _measure_array_types,
    _measure_batched,
    _measure_moves,
    _measure_scale,
    _measure_tracing,
)
from ._memory import _measure_memory
from ._plot import _plot
from ._report import _machine, _table, _targets_table
from ._targets import _missed, _mpi_targets, _targets


def _measure_mpi(quick: bool, progress: Callable[[str], None]) -> dict[str, Any] | None:
    """Our cross-process all_reduce against raw mpi4py, when the [mpi] extra is installed.

    Runs ``asyncreplica bench --mpi`` (2 processes x 4 replicas, under mpiexec) and
    returns its printed table and its JSON report; None, with a progress line saying
    why, when MPI is not available.
    """
    from ..._launch import find_mpiexec, launched_by_mpiexec

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
        The exit status: 0; 1 with ``--check`` when a target was missed (or not
        measured); 2 for a usage error.
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
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit with status 1 when a target is missed (or was not measured)",
    )
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
            [8, 4096],  # what the target is about, in fewer rounds
            _loops(),
            args.repeat or 3,
            8 << 20,
            batch_rounds=5,
            memory_collectives=10_000,
            idle_replicas=1000,
            scale_budget=16_384,
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
    rows += _measure_array_types(plan, progress)
    rows += _measure_batched(plan, progress)
    rows += _measure_tracing(plan, progress)
    targets = _targets(rows) + _measure_memory(plan, progress)
    mpi = _measure_mpi(args.quick, progress)
    if mpi is not None:
        replicas = mpi["report"]["replicas"]
        progress(f"local rendezvous of {replicas} replicas (the MPI 8 B floor's local part)")
        targets += _mpi_targets(mpi["report"], _local_rendezvous_us(plan, replicas))
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
            json.dump(_json_safe(report), f, indent=1, allow_nan=False)
    if args.plot:
        _plot(rows, targets, args.plot)
    progress("done")
    missed = _missed(targets)
    if args.check and missed:
        for t in missed:
            print(f"asyncreplica bench: missed: {t.figure}: {t.target}", file=sys.stderr)
        return 1
    return 0


def _json_safe(value: Any) -> Any:
    """``value`` with every NaN (a figure not measured) as None: strict JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value
