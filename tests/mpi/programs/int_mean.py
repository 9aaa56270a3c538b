"""MEAN of integers across processes: the one-process bits (run under mpiexec).

Usage: ``mpiexec -n P python int_mean.py``. Process ``r`` runs ``r + 1`` replicas. Integer
values whose sum overflows their dtype (int8 near 100, int64 near 2**62, uint64 near
2**64) are averaged with ``all_reduce``, ``reduce_scatter`` and ``Strategy.reduce`` under
``MultiWorkerMirroredStrategy`` and, as the oracle, under a one-process
``MirroredStrategy`` with every global replica: the results must be bit-identical, on the
inline, gathered and MPI Allreduce paths. Prints ``rank=R ok ...`` and ``rank=R done``.
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


def values(g: int, n: int) -> dict[str, np.ndarray[Any, Any]]:
    k = np.arange(n) % 3
    return {
        "i1": (k + 100 + g).astype("i1"),  # 100 + 101 wraps in int8
        "i1neg": (-k - 120 - g % 3).astype("i1"),
        "u1": (k + 250 - g).astype("u1"),
        "i4": (k + 2**30 + g).astype(">i4"),  # big-endian, and the sum wraps in int32
        "i8": (k + 2**62 + 977 * g).astype("i8"),  # the sum wraps in int64
        "i8neg": (-(k + 2**62) - 977 * g).astype("i8"),
        "u8": np.uint64(2**64 - 1) - (k + 3 * g).astype("u8"),
    }


async def step() -> dict[str, Any]:
    ctx = ar.get_replica_context()
    assert ctx is not None
    g = ctx.replica_id_in_sync_group
    out: dict[str, Any] = {}
    for label, n in SIZES.items():
        for name, v in values(g, n).items():
            out[f"{label}.MEAN.{name}"] = await ctx.all_reduce("MEAN", v)
        # Mixed leaves in one call: floats beside integers.
        mixed = [values(g, n)["i1"], np.full(n, g + 0.5), values(g, n)["i8"]]
        out[f"{label}.MEAN.mixed"] = await ctx.all_reduce("MEAN", mixed)
    for name, v in values(g, 2 * TOTAL).items():
        out[f"scatter.{name}"] = await ctx.reduce_scatter("MEAN", v, axis=0)
    out["scalar.i1"] = await ctx.all_reduce("MEAN", np.int8(100 + g))
    return out


async def ints() -> dict[str, Any]:
    ctx = ar.get_replica_context()
    assert ctx is not None
    g = ctx.replica_id_in_sync_group
    k = np.arange(12).reshape(3, 4)
    return {
        "i1": (k % 3 + 100 + g).astype("i1"),
        "u1": (k % 3 + 250 - g).astype("u1"),
        "i4": (k + 2**30 + g).astype("i4"),
    }


def check(name: str, got: object, want: object) -> None:
    got_a, want_a = np.asarray(got), np.asarray(want)
    assert got_a.shape == want_a.shape, (name, got_a.shape, want_a.shape)
    assert got_a.dtype == want_a.dtype, (name, got_a.dtype, want_a.dtype)
    assert got_a.tobytes() == want_a.tobytes(), (name, got_a, want_a)


def flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        return {k: v for key in tree for k, v in flat(tree[key], f"{prefix}{key}.").items()}
    if isinstance(tree, (list, tuple)):
        return {k: v for i, x in enumerate(tree) for k, v in flat(x, f"{prefix}{i}.").items()}
    return {prefix: tree}


async def main() -> None:
    oracle = ar.MirroredStrategy([f"CPU:{i}" for i in range(TOTAL)])
    wanted = oracle.experimental_local_results(await oracle.run(step))
    strategy = ar.MultiWorkerMirroredStrategy([f"CPU:{i}" for i in range(RANK + 1)])
    got = strategy.experimental_local_results(await strategy.run(step))
    first = strategy._replica_offset
    checked = 0
    for local, out in enumerate(got):
        want = flat(wanted[first + local])
        mine = flat(out)
        assert sorted(mine) == sorted(want)
        for key in sorted(mine):
            check(key, mine[key], want[key])
            checked += 1
    print(f"rank={RANK} ok {checked} all_reduce and reduce_scatter values", flush=True)
    want_values = await oracle.run(ints)
    got_values = await strategy.run(ints)
    for axis in (None, 0, (0, 1)):
        want = flat(await oracle.reduce("MEAN", want_values, axis=axis))
        mine = flat(await strategy.reduce("MEAN", got_values, axis=axis))
        for key in sorted(want):
            check(f"reduce axis={axis} {key}", mine[key], want[key])
    print(f"rank={RANK} ok strategy.reduce", flush=True)
    print(f"rank={RANK} done", flush=True)


if __name__ == "__main__":
    anyio.run(main)
