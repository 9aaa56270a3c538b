"""Property: random programs across processes never hang and never give wrong results.

Each launch runs ``programs/properties.py`` under ``mpiexec -n 2`` or ``-n 3`` over a batch
of seeds: every rank draws the same random program per seed (the generator of
``tests/random_programs.py``: dtypes incl. int8 MEAN and bool, dict key orders, nests, two
call sites, deep helper chains, same-line pairs; faults skip, extra, change, swap, swap at
depth, a replica that raises) on 1 or 2 replicas per process, runs it under
``MultiWorkerMirroredStrategy``, and checks the numpy oracle on its own replicas. The last
program of a launch may also make one process exit in the middle of its step, or stall past
the others' ``timeout_seconds``: the others must raise, not wait.

What fails only across processes today is kept out of the draw by
``random_programs.KNOWN_BROKEN_MPI`` (its comments say which issue item each waits for):
empty it as the fixes land.

CI runs 2 launches of ``ASYNCREPLICA_MPI_PROPERTY_SEEDS`` programs (default 12); set it
higher (and ``ASYNCREPLICA_MPI_PROPERTY_LAUNCHES``) for a larger local run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from asyncreplica._launch import find_mpiexec

pytest.importorskip("mpi4py", reason="the [mpi] extra (mpi4py, mpich) is not installed")

PROGRAM = Path(__file__).parent / "programs" / "properties.py"
SEEDS = int(os.environ.get("ASYNCREPLICA_MPI_PROPERTY_SEEDS", "12"))
LAUNCHES = int(os.environ.get("ASYNCREPLICA_MPI_PROPERTY_LAUNCHES", "2"))
# The whole launch's hang guard: about 1 s per program on a loaded machine, plus the
# program's own guard (20 s) and a stall (6 s) for the last one.
HANG_GUARD_S = 60 + 3 * SEEDS


def launches() -> list[Any]:
    """(processes, first seed) per launch: -n 2 and -n 3 alternate."""
    return [
        pytest.param(2 + k % 2, 1000 * k, id=f"n{2 + k % 2}-seeds{1000 * k}")
        for k in range(LAUNCHES)
    ]


def records(log: Path) -> tuple[dict[int, dict[str, Any]], bool]:
    """A rank's log: its record per seed, and whether it logged ``done``."""
    if not log.exists():
        return {}, False
    out: dict[int, dict[str, Any]] = {}
    done = False
    for line in log.read_text(encoding="utf-8").splitlines():
        if line == "done":
            done = True
        elif line.startswith("{"):
            record = json.loads(line)
            out[record["seed"]] = record
    return out, done


@pytest.mark.parametrize(("n", "first"), launches())
def test_random_programs_across_processes(n: int, first: int, tmp_path: Path) -> None:
    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.skip("mpiexec not found (pip install 'asyncreplica[mpi]' brings MPICH's)")
    env = {**os.environ, "ASYNCREPLICA_TEST_OUT": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    env.pop("ASYNCREPLICA_TRACE", None)
    command = [mpiexec, "-n", str(n), sys.executable, str(PROGRAM), str(first), str(SEEDS)]
    again = f"ASYNCREPLICA_MPI_PROPERTY_ONLY=<seed> mpiexec -n {n} python {PROGRAM} {first} {SEEDS}"
    try:
        proc = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
            env=env,
            check=False,
        )
        output, timed_out = proc.stdout + proc.stderr, False
    except subprocess.TimeoutExpired as exc:
        output, timed_out = f"{exc.stdout!s}{exc.stderr!s}", True
    logs = [records(tmp_path / f"rank{rank}.log") for rank in range(n)]
    last = first + SEEDS - 1
    for seed in range(first, last + 1):
        for rank, (seen, _) in enumerate(logs):
            record = seen.get(seed)
            if record is None:
                continue
            assert record["violation"] is None, (
                f"seed {seed}, rank {rank}: {record['outcome']}\n{record['violation']}\n"
                f"{record.get('error', '')}\nreproduce: {again}"
            )
            assert record["outcome"] != "hang"
    fault = next((r["fault"] for seen, _ in logs if last in seen for r in [seen[last]]), None)
    for seed in range(first, last):
        missing = [rank for rank, (seen, _) in enumerate(logs) if seed not in seen]
        assert not missing, (
            f"ranks {missing} never finished program {seed} (hang guard {HANG_GUARD_S} s "
            f"{'hit' if timed_out else 'not hit'}): reproduce: {again}\n{output[-3000:]}"
        )
    if fault is None:
        assert not timed_out, f"the launch hung after every program ran\n{output[-3000:]}"
        assert proc.returncode == 0, output[-3000:]
        assert all(done for _, done in logs), output[-3000:]
        return
    # The last program made one process exit or stall: every other one raised at once.
    kind, culprit = fault
    assert not timed_out, f"{kind} of process {culprit} left the others waiting\n{output[-3000:]}"
    for rank, (seen, _) in enumerate(logs):
        if rank != culprit:
            assert last in seen, (
                f"process {rank} said nothing after process {culprit}'s {kind}\n{output[-3000:]}"
            )
            assert seen[last]["outcome"] != "ok" or kind == "exit", seen[last]
