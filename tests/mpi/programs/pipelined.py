"""A pipelined all_reduce gives the unpipelined bits, on every process (under mpiexec).

Usage: ``mpiexec -n P python pipelined.py``. Process ``r`` runs ``r + 1`` replicas of
random float32 / float64 / int64 leaves from :data:`PIPELINE_BYTES` up (odd sizes, so
the last chunk is short; 2-d shapes). Each result must equal, bit for bit, what the
unpipelined path computes: the local replicas combined in replica order, then one
``Allreduce`` of the processes' partial results (a blocking one, over the whole buffer,
on a duplicate of COMM_WORLD), MEAN divided by the global replica count last. The
pipelined path must have been taken (it is counted), and results must be read-only.
Prints ``rank=R ok NAME`` per check and ``rank=R done``.
"""

from __future__ import annotations

import hashlib
from typing import Any

import anyio
import numpy as np
from asyncreplica_mpi import _backend
from mpi4py import MPI

import asyncreplica as ar

RANK = MPI.COMM_WORLD.Get_rank()
SIZE = MPI.COMM_WORLD.Get_size()
LOCAL = RANK + 1
TOTAL = sum(r + 1 for r in range(SIZE))
OPS = {"SUM": (np.add, MPI.SUM), "MAX": (np.maximum, MPI.MAX), "PROD": (np.multiply, MPI.PROD)}
CASES = [
    ("f4", (_backend.PIPELINE_BYTES // 4 + 12345,)),
    ("f8", (97, (3 * _backend.PIPELINE_CHUNK_BYTES) // (8 * 97) + 5)),
    ("i8", (_backend.PIPELINE_BYTES // 8 + 1,)),
]
taken: list[int] = []
_pipelined = _backend.MPIBackend._pipelined


async def counted(self: Any, op: Any, arrays: Any) -> Any:
    taken.append(1)
    return await _pipelined(self, op, arrays)


_backend.MPIBackend._pipelined = counted  # type: ignore[method-assign]


def inputs(dtype: str, shape: tuple[int, ...], g: int) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(1000 * g + len(shape))
    if dtype == "i8":
        return rng.integers(-1000, 1000, shape).astype(np.int64)
    # Magnitudes spread over many binades, so that the order of additions shows.
    return (rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 6, shape)).astype(dtype)


def expected(op: str, dtype: str, shape: tuple[int, ...], comm: Any) -> np.ndarray[Any, Any]:
    """The unpipelined path's bits: replica order here, one whole Allreduce, MEAN last."""
    ufunc, mpi_op = OPS["SUM" if op == "MEAN" else op]
    first = RANK * (RANK + 1) // 2  # this process's first global replica
    arrays = [inputs(dtype, shape, first + r) for r in range(LOCAL)]
    local = np.array(arrays[0]) if LOCAL == 1 else ufunc(arrays[0], arrays[1])
    for a in arrays[2:]:
        ufunc(local, a, out=local)
    out = np.empty_like(local)
    comm.Allreduce(local, out, op=mpi_op)
    return np.true_divide(out, TOTAL) if op == "MEAN" else out


async def step(dtype: str, shape: tuple[int, ...], op: str) -> object:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return await ctx.all_reduce(op, inputs(dtype, shape, ctx.replica_id_in_sync_group))


async def main() -> None:
    comm = MPI.COMM_WORLD.Dup()
    strategy = ar.MultiWorkerMirroredStrategy([f"CPU:{i}" for i in range(LOCAL)])
    for dtype, shape in CASES:
        for op in ("SUM", "MEAN", "MAX", "PROD"):
            if op == "MEAN" and dtype == "i8":
                continue  # exact integer MEAN: its own path (int_mean.py)
            before = len(taken)
            got = strategy.experimental_local_results(
                await strategy.run(step, args=(dtype, shape, op))
            )
            assert len(taken) == before + 1, (dtype, op, "not pipelined")
            want = expected(op, dtype, shape, comm)
            for value in got:
                array = np.asarray(value)
                assert not array.flags.writeable, (dtype, op)
                assert array.shape == shape, (dtype, op)
                assert array.dtype == want.dtype, (dtype, op)
                assert array.tobytes() == want.tobytes(), (dtype, op, "bits differ")
            print(f"rank={RANK} ok {dtype}.{op}", flush=True)
    # The same leaf every process sees: identical bits everywhere.
    digests = comm.allgather(hashlib.sha256(np.asarray(got[0]).tobytes()).hexdigest())
    assert len(set(digests)) == 1, digests
    comm.Free()
    print(f"rank={RANK} done", flush=True)


if __name__ == "__main__":
    anyio.run(main)
