"""Small all_reduces, whose data travels with the agreement (run under mpiexec).

Usage: ``mpiexec -n P python inline.py``. Process ``r`` runs ``r + 1`` replicas. The
processes reuse one buffer for every exchange: results must not alias it, leaves of
mixed dtypes at odd offsets must come back intact, and a scalar's MEAN stays an array.
Partial results of up to 2 KiB make no data transfer of their own; larger ones do.
Prints ``rank=R ok NAME`` per check and ``rank=R done``.
"""

from __future__ import annotations

import anyio
import numpy as np
from asyncreplica_mpi._backend import MPIBackend
from mpi4py import MPI

import asyncreplica as ar

RANK = MPI.COMM_WORLD.Get_rank()
SIZE = MPI.COMM_WORLD.Get_size()
TOTAL = sum(r + 1 for r in range(SIZE))
IDS = range(TOTAL)
KIB = 256  # float32: 1 KiB, travels with its agreement
OVER = 513  # float32: 2052 bytes, one past the inline size: a transfer of its own

# The data transfers after an agreement (MPI collectives on the data communicator).
moves: list[str] = []
_move = MPIBackend._move


async def _counted(self: MPIBackend, nbytes: int, name: str, *args: object, **kw: object) -> None:
    moves.append(name)
    await _move(self, nbytes, name, *args, **kw)


MPIBackend._move = _counted  # type: ignore[method-assign]


def check(name: str, got: object, want: object) -> None:
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want, err_msg=name)
    assert not got.flags.writeable, name
    print(f"rank={RANK} ok {name}", flush=True)


def tree(g: int) -> dict[str, object]:
    # int8[3] first: every later leaf starts at an odd offset in the payload.
    return {
        "a": np.array([g, -g, 1], np.int8),
        "b": np.full((2, 2), g + 0.5, np.float64),
        "c": np.float32(g),
        "d": np.zeros(0, np.float32),
        "e": np.array([g + 1j * g], np.complex64),
    }


async def step() -> dict[str, object]:
    ctx = ar.get_replica_context()
    assert ctx is not None
    g = ctx.replica_id_in_sync_group
    out: dict[str, object] = {}
    out["sums"] = [await ctx.all_reduce("SUM", np.float32(g + k)) for k in range(5)]
    out["tree"] = await ctx.all_reduce("SUM", tree(g))
    out["max"] = await ctx.all_reduce("MAX", tree(g))
    out["mean"] = await ctx.all_reduce("MEAN", np.float32(g))
    out["imean"] = await ctx.all_reduce("MEAN", np.int64(g))
    out["prod"] = await ctx.all_reduce("PROD", np.full(3, 2, np.int32))
    out["empty"] = await ctx.all_reduce("SUM", [])
    out["kib"] = await ctx.all_reduce("SUM", np.full(KIB, g, np.float32))
    out["moves"] = list(moves)
    out["over"] = await ctx.all_reduce("SUM", np.full(OVER, g, np.float32))
    return out


async def main() -> None:
    strategy = ar.MultiWorkerMirroredStrategy([f"CPU:{i}" for i in range(RANK + 1)])
    result = await strategy.run(step)
    trees = [tree(g) for g in IDS]
    for out in strategy.experimental_local_results(result):
        assert isinstance(out, dict)
        for k, got in enumerate(out["sums"]):
            check(f"sum{k}", got, np.float32(sum(g + k for g in IDS)))
        for key in "abcde":
            leaves = [t[key] for t in trees]
            check(f"tree.{key}", out["tree"][key], np.sum(leaves, axis=0, dtype=leaves[0].dtype))
            check(f"max.{key}", out["max"][key], np.maximum.reduce(np.array(leaves)))
        check("mean", out["mean"], np.float32(sum(IDS) / TOTAL))
        check("imean", out["imean"], np.float64(sum(IDS) / TOTAL))
        check("prod", out["prod"], np.full(3, 2**TOTAL, np.int32))
        assert out["empty"] == []
        check("kib", out["kib"], np.full(KIB, sum(IDS), np.float32))
        check("over", out["over"], np.full(OVER, sum(IDS), np.float32))
        assert out["moves"] == [], out["moves"]  # everything up to 1 KiB travelled inline
        with np.testing.assert_raises(ValueError):
            np.asarray(out["mean"]).flags.writeable = True
    assert moves == ["Allgather"], moves  # the 2052 bytes moved after their agreement
    print(f"rank={RANK} done", flush=True)


if __name__ == "__main__":
    anyio.run(main)
