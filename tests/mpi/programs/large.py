"""Large all_reduces, which MPI reduces (run under mpiexec).

Usage: ``mpiexec -n P python large.py [asyncio|trio]``. Process ``r`` runs ``r + 1`` replicas with
random float inputs. For each way a large value travels (one leaf reduced in place in
the local result's buffer, below and above 2 MiB; leaves of two dtypes from a batch,
reduced into another buffer; MEAN), every replica's result must:

* have the bits of MPI's own ``Allreduce`` of the processes' local sums (replica order
  within a process, then MPI's sum), blocking and non-blocking alike;
* be read-only for good: no view of it can be made writable again;
* stay as it was while later collectives of the same size run (buffers are reused
  only once no replica holds a view of them).

It also checks that no thread is started to move the data (the loop drives MPI
itself: a worker thread competing with the loop for a core doubled the transfer time).
Prints ``rank=R ok NAME`` per check and ``rank=R done``.
"""

from __future__ import annotations

import sys
import threading

import anyio
import numpy as np
from mpi4py import MPI

import asyncreplica as ar

RANK = MPI.COMM_WORLD.Get_rank()
COMM = MPI.COMM_WORLD
OFFSETS = [sum(r + 1 for r in range(rank)) for rank in range(COMM.Get_size())]
ROUNDS = 3

# (name, op, per-replica leaves: (elements, dtype) each)
CASES = [
    ("one leaf, 256 KiB", "SUM", [(1 << 16, np.float32)]),
    ("one leaf, 4 MiB", "SUM", [(1 << 20, np.float32)]),
    ("two dtypes", "SUM", [(40_000, np.float64), (50_000, np.float32)]),
    ("one leaf, MEAN", "MEAN", [(1 << 17, np.float64)]),
]

started: list[str] = []
_start = threading.Thread.start


def _record(self: threading.Thread) -> None:
    started.append(self.name)
    _start(self)


threading.Thread.start = _record  # type: ignore[method-assign]


def value(g: int, k: int, spec: list[tuple[int, type]]) -> list[np.ndarray]:
    """Replica ``g``'s leaves at round ``k`` (random, so that the sum order shows)."""
    rng = np.random.default_rng([g, k, len(spec)])
    return [rng.standard_normal(n).astype(dtype) for n, dtype in spec]


def expected(op: str, k: int, spec: list[tuple[int, type]]) -> list[np.ndarray]:
    """MPI's Allreduce of this process's local sums: blocking and non-blocking agree."""
    mine = [value(OFFSETS[RANK] + i, k, spec) for i in range(RANK + 1)]
    want = []
    for j in range(len(spec)):
        local = mine[0][j].copy()
        for leaves in mine[1:]:
            local = local + leaves[j]  # replica order
        blocking = np.empty_like(local)
        COMM.Allreduce(local, blocking, op=MPI.SUM)
        posted = np.empty_like(local)
        COMM.Iallreduce(local, posted, op=MPI.SUM).Wait()
        assert blocking.tobytes() == posted.tobytes(), "MPI's two Allreduces differ"
        if op == "MEAN":
            blocking = np.true_divide(blocking, OFFSETS[-1] + COMM.Get_size())
        want.append(blocking)
    return want


async def step(spec: list[tuple[int, type]], op: str) -> list[list[np.ndarray]]:
    ctx = ar.get_replica_context()
    assert ctx is not None
    g = ctx.replica_id_in_sync_group
    kept = []
    for k in range(ROUNDS):
        kept.append(list(await ctx.all_reduce(op, value(g, k, spec))))
    return kept


async def main() -> None:
    strategy = ar.MultiWorkerMirroredStrategy([f"CPU:{i}" for i in range(RANK + 1)])
    for name, op, spec in CASES:
        started.clear()
        result = await strategy.run(step, args=(spec, op))
        threads = [t for t in started if "transfer" in t]
        assert not threads, (name, threads)
        wants = [expected(op, k, spec) for k in range(ROUNDS)]  # collective: once each
        for kept in strategy.experimental_local_results(result):
            for k in range(ROUNDS):
                for got, want in zip(kept[k], wants[k], strict=True):
                    assert got.tobytes() == want.tobytes(), (name, k)
                    assert not got.flags.writeable, name
                    try:
                        got.view().flags.writeable = True
                    except ValueError:
                        pass
                    else:
                        raise AssertionError(f"{name}: a result was made writable again")
        print(f"rank={RANK} ok {name}", flush=True)
    print(f"rank={RANK} done", flush=True)


if __name__ == "__main__":
    anyio.run(main, backend=sys.argv[1] if len(sys.argv) > 1 else "asyncio")
