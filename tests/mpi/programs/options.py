"""Strategy options that must agree across processes (run under mpiexec).

Usage: ``mpiexec -n P python options.py SCENARIO``. Each process creates a
``MultiWorkerMirroredStrategy`` whose options differ on the last process, logs what the
constructor raised (its class, then its message), then creates one with the same
options everywhere and runs an ``all_reduce`` (the processes must still be in step).

Scenarios: ``call_sites`` (``check_call_sites=False`` on the last process), ``backend``
(a local backend of another name on the last process), ``same`` (options that may
differ: ``stall_warning_seconds``, ``bytes_per_pack``, ``timeout_seconds``, devices).
"""

from __future__ import annotations

import sys

import anyio
import numpy as np
from _report import report
from asyncreplica_numpy import NumpyBackend
from mpi4py import MPI

import asyncreplica as ar

SIZE = MPI.COMM_WORLD.Get_size()
RANK = MPI.COMM_WORLD.Get_rank()
LAST = RANK == SIZE - 1


class Renamed(NumpyBackend):
    """A local backend of another name (it could reduce by other rules)."""

    name = "renamed"


def options(scenario: str) -> dict[str, object]:
    if scenario == "call_sites":
        return {"check_call_sites": not LAST}
    if scenario == "backend":
        backend = (Renamed if LAST else NumpyBackend)([f"CPU:{i}" for i in range(1 + RANK % 2)])
        return {"backend": backend}
    assert scenario == "same", scenario
    return {
        "stall_warning_seconds": 5.0 if LAST else None,
        "communication_options": ar.CommunicationOptions(
            bytes_per_pack=1024 * RANK, timeout_seconds=30 if LAST else None
        ),
    }


async def step() -> object:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return await ctx.all_reduce("SUM", np.ones(2))


async def main(scenario: str) -> None:
    devices = [f"CPU:{i}" for i in range(1 + RANK % 2)]
    try:
        strategy = ar.MultiWorkerMirroredStrategy(devices, **options(scenario))  # type: ignore[arg-type]
    except Exception as error:  # logged for the test
        report(type(error).__name__)
        report(str(error))
        strategy = ar.MultiWorkerMirroredStrategy(devices)
    else:
        report("created")
    # the processes are still in step: a collective, then another strategy
    result = strategy.experimental_local_results(await strategy.run(step))[0]
    report(f"again {np.asarray(result).tolist()}")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])
