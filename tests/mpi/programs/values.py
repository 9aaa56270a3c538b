"""Values across processes equal the same program's values in one process (run under mpiexec).

Usage: ``mpiexec -n P python values.py``. Process ``r`` runs ``r + 1`` replicas. Every
rank runs the step under ``MultiWorkerMirroredStrategy`` and, as the oracle, under a
one-process ``MirroredStrategy`` with every global replica; the results must have the
same values and shapes. The inputs are what a careless user passes: big-endian arrays
(``'>f8'``, ``'>i4'``; a different byte order on each process), 0-d arrays and numpy
scalars. Prints ``rank=R ok NAME`` per check and ``rank=R done``.
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
from mpi4py import MPI

import asyncreplica as ar

RANK = MPI.COMM_WORLD.Get_rank()
SIZE = MPI.COMM_WORLD.Get_size()
TOTAL = sum(r + 1 for r in range(SIZE))
# Sizes: inline (travels with the agreement), gathered in rank order, MPI Allreduce.
SIZES = {"small": 3, "medium": 1000, "large": 20000}


def order(g: int) -> str:
    """The byte order replica ``g`` uses: big-endian on process 0, mixed elsewhere."""
    return ">" if g < 2 or g % 2 else "<"


async def step() -> dict[str, Any]:
    ctx = ar.get_replica_context()
    assert ctx is not None
    g = ctx.replica_id_in_sync_group
    e = order(g)
    out: dict[str, Any] = {}
    for label, n in SIZES.items():
        x = (np.arange(n) % 7 + g + 1).astype(f"{e}f8")
        i = (np.arange(n) % 5 + g).astype(f"{e}i4")
        for op in ("SUM", "MAX", "MIN", "MEAN", "PROD"):
            out[f"{label}.{op}.f8"] = await ctx.all_reduce(op, x)
            out[f"{label}.{op}.i4"] = await ctx.all_reduce(op, i)
        out[f"{label}.gather"] = await ctx.all_gather(x.reshape(1, -1), 0)
        for source in range(TOTAL):
            out[f"{label}.bcast{source}"] = await ctx.broadcast(x, source)
    scalars = {
        "f8": np.array(g + 1.5, f"{e}f8"),
        "npf": np.float64(g + 2.5),
        "i4": np.array(g, f"{e}i4"),
        "f4s": np.float32(g),
    }
    for name, value in scalars.items():
        for source in range(TOTAL):
            out[f"scalar.{name}.bcast{source}"] = await ctx.broadcast(value, source)
        out[f"scalar.{name}.sum"] = await ctx.all_reduce("SUM", value)
        out[f"scalar.{name}.gather"] = await ctx.all_gather(np.reshape(value, (1,)), 0)
    return out


def check(name: str, got: object, want: object) -> None:
    got_a, want_a = np.asarray(got), np.asarray(want)
    assert got_a.shape == want_a.shape, (name, got_a.shape, want_a.shape)
    assert got_a.dtype.kind == want_a.dtype.kind, (name, got_a.dtype, want_a.dtype)
    np.testing.assert_array_equal(got_a, want_a, err_msg=name)


async def main() -> None:
    oracle = ar.MirroredStrategy([f"CPU:{i}" for i in range(TOTAL)])
    wanted = oracle.experimental_local_results(await oracle.run(step))
    strategy = ar.MultiWorkerMirroredStrategy([f"CPU:{i}" for i in range(RANK + 1)])
    got = strategy.experimental_local_results(await strategy.run(step))
    first = strategy._replica_offset
    for local, out in enumerate(got):
        want = wanted[first + local]
        assert sorted(out) == sorted(want)
        for key in sorted(out):
            check(key, out[key], want[key])
    print(f"rank={RANK} ok {len(got[0])} values", flush=True)
    print(f"rank={RANK} done", flush=True)


if __name__ == "__main__":
    anyio.run(main)
