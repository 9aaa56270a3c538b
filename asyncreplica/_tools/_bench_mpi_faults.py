"""``asyncreplica bench --mpi``: how soon a fault in one process reaches the others.

Each kind of fault runs in its own ``mpiexec -n P`` job (one of them ends a process):
the last rank makes the fault, every other rank waits at a collective for it and must
raise the error the kind calls for. The latency of a job is the time from just before
the fault (on the faulty rank) to the last other rank's error, on one clock
(``time.time_ns``: the processes share one machine). Kinds, as in the test suite's
``tests/mpi/programs/latency.py``:

* ``skip``: the faulty rank's replicas return one collective early;
* ``swap``: it issues two collectives in swapped order (the same collective from
  another call path first);
* ``mismatch``: another shape;
* ``raise``: a replica raises;
* ``exit``: the process exits between two runs (its exit hook tells the others);
* ``transfer``: it fails inside a data transfer, after the processes agreed.

Run from the command line (``asyncreplica bench --mpi``) after the all_reduce table;
under mpiexec, ``python -m asyncreplica._tools._bench_mpi_faults KIND FOLDER`` is one job.
Unlike the library runtime, this module imports numpy and mpi4py: it is a program.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

__all__ = ["GUARD_SECONDS", "KINDS", "LIMIT_SECONDS", "measure", "table"]

#: The fault kinds, each with the error every other process must raise.
KINDS = {
    "skip": "ReplicaExitedError",
    "swap": "CollectiveMismatchError",
    "mismatch": "CollectiveMismatchError",
    "raise": "ReplicaExitedError",
    "exit": "ReplicaExitedError",
    "transfer": "ReplicaExitedError",
}
#: Issue 17's bound on a fault's latency, in seconds.
LIMIT_SECONDS = 0.2
#: A job that has not ended after this long is stopped: its fault was not delivered.
GUARD_SECONDS = 60.0


def _program(kind: str, folder: str) -> int:
    """One job (under mpiexec): make or wait for the fault; write ``rank<R>.json``."""
    import anyio
    import numpy as np
    from mpi4py import MPI

    import asyncreplica as ar

    rank = MPI.COMM_WORLD.Get_rank()
    faulty = rank == MPI.COMM_WORLD.Get_size() - 1
    note: dict[str, Any] = {"rank": rank}

    def fault() -> None:
        note.setdefault("fault_ns", time.time_ns())
        _write(folder, note)

    async def helper(ctx: ar.ReplicaContext, x: object) -> object:
        return await ctx.all_reduce("SUM", x)

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        await ctx.all_reduce("SUM", np.ones(3))
        if faulty and kind == "skip":
            fault()
            return
        if faulty and kind == "swap":
            fault()
            await helper(ctx, np.ones(3))  # the same collective, from another call path
            await ctx.all_reduce("SUM", np.ones(3))
            return
        if faulty and kind == "mismatch":
            fault()
            await ctx.all_reduce("SUM", np.ones(4))
            return
        if faulty and kind == "raise":
            fault()
            raise ValueError("a replica failed")
        if kind == "transfer":
            await ctx.all_reduce("SUM", np.ones(100_000))
            return
        await ctx.all_reduce("SUM", np.ones(3))
        await helper(ctx, np.ones(3))

    async def main() -> None:
        strategy = ar.MultiWorkerMirroredStrategy(["CPU:0", "CPU:1"])
        if kind == "transfer" and faulty:
            from asyncreplica_mpi import MPIBackend

            async def refuse(self: object, *args: object, **kwargs: object) -> None:
                fault()
                raise TypeError("simulated transfer failure")

            MPIBackend._move = refuse
        if kind == "exit":
            await strategy.run(step)
            if faulty:
                fault()
                sys.exit(0)  # between two runs: the exit hook tells the others
        try:
            await strategy.run(step)
        except Exception as exc:
            if not faulty:
                note.update(error_ns=time.time_ns(), error=type(exc).__name__)
                _write(folder, note)

    try:
        anyio.run(main)
    except Exception:
        return 1
    return 0


def _write(folder: str, note: dict[str, Any]) -> None:
    path = os.path.join(folder, f"rank{note['rank']}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(note, f)


def _one(mpiexec: str, processes: int, kind: str) -> float | None:
    """One job's latency in seconds; None when some process did not raise as it should."""
    with tempfile.TemporaryDirectory() as folder:
        command = [mpiexec, "-n", str(processes), sys.executable, "-m", __name__, kind, folder]
        try:
            subprocess.run(command, capture_output=True, timeout=GUARD_SECONDS, check=False)
        except subprocess.TimeoutExpired:
            return None
        notes = []
        for rank in range(processes):
            path = os.path.join(folder, f"rank{rank}.json")
            if not os.path.exists(path):
                return None
            with open(path, encoding="utf-8") as f:
                notes.append(json.load(f))
    start = notes[-1].get("fault_ns")
    errors = [n.get("error_ns") for n in notes[:-1] if n.get("error") == KINDS[kind]]
    if start is None or len(errors) != processes - 1:
        return None
    return max(0.0, (int(max(errors)) - int(start)) / 1e9)


def measure(
    mpiexec: str, processes: int, repeat: int, progress: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Every kind's fault latency: the worst of ``repeat`` jobs (None if one failed).

    Returns:
        One row per kind: ``kind``, ``processes``, ``latency_s`` (the worst job's, or
        None when some process of some job never raised the kind's error) and
        ``samples_s`` (each job's, None where it failed).
    """
    rows = []
    for kind in KINDS:
        samples = [_one(mpiexec, processes, kind) for _ in range(repeat)]
        worst = None if None in samples else max(s for s in samples if s is not None)
        rows.append(
            {"kind": kind, "processes": processes, "latency_s": worst, "samples_s": samples}
        )
        progress(f"  fault latency, {kind}: " + ("never" if worst is None else f"{worst:.3f} s"))
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The printed report."""
    processes = rows[0]["processes"] if rows else 0
    lines = [
        (
            f"fault latency across {processes} MPI processes (worst of each kind's jobs; "
            f"target <= {LIMIT_SECONDS:g} s)"
        ),
        f"{'kind':>10}  {'latency':>10}  samples",
    ]
    for row in rows:
        worst = row["latency_s"]
        shown = "never" if worst is None else f"{worst * 1e3:.1f} ms"
        samples = ", ".join("never" if s is None else f"{s * 1e3:.1f}" for s in row["samples_s"])
        lines.append(f"{row['kind']:>10}  {shown:>10}  {samples}")
    lines.append(
        "latency: from just before the fault on the last process to the last other "
        "process's error (the kind's own error, or it counts as never)"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(_program(sys.argv[1], sys.argv[2]))
