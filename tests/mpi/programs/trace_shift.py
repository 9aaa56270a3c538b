"""A merged MPI trace never has negative timestamps (run under ``mpiexec -n 2``).

Process 1 began its trace 1 s before process 0 and recorded an event then (at its own
``ts`` 0): aligned at the barrier, that event precedes rank 0's origin by about 1 s. The
merged trace is moved as a whole so that its earliest event is at 0, keeping every
offset between events. Rank 0 logs ``ok``, then every rank ``done``.
"""

from __future__ import annotations

import time

import anyio
from _report import RANK, report

import asyncreplica as ar


def doc(ts: list[float]) -> dict[str, object]:
    events = [{"name": "e", "ph": "X", "ts": t, "dur": 1.0, "pid": 0, "tid": 0} for t in ts]
    return {"traceEvents": events, "otherData": {}}


async def main() -> None:
    strategy = ar.MultiWorkerMirroredStrategy(["CPU:0"])
    group = strategy._group
    assert group is not None
    merger = group.trace_session()  # type: ignore[attr-defined]
    now = time.perf_counter_ns()
    if RANK == 0:
        merged = merger.merge(doc([5.0, 10.0]), now)  # origin now: events after it
    else:
        merged = merger.merge(doc([0.0, 2.0]), now - 1_000_000_000)  # origin 1 s ago
    if RANK == 0:
        assert merged is not None
        ts = {(e["pid"], e["ts"]) for e in merged["traceEvents"]}
        assert min(t for _, t in ts) == 0.0, ts
        rank1 = sorted(t for p, t in ts if p == 1)
        rank0 = sorted(t for p, t in ts if p == 0)
        assert rank1[0] == 0.0, rank1
        assert abs(rank1[1] - rank1[0] - 2.0) < 1e-6, rank1
        # Rank 0's events stay about 1 s after rank 1's first one (barrier skew aside).
        assert 0.9e6 < rank0[0] < 1.1e6, rank0
        assert abs(rank0[1] - rank0[0] - 5.0) < 1e-6, rank0
        assert "before rank 0's origin" in merged["otherData"]["clock"]
        report("ok")
    report("done")


if __name__ == "__main__":
    anyio.run(main)
