"""A process whose replicas are at no collective (its event loop idle) is told of a failure.

Usage: ``mpiexec -n P python idle_peer.py <scenario> <loop>`` (P = 2 or 3; loop:
``asyncio`` or ``trio``), or ``python idle_peer.py <scenario> <loop> one P`` for the same
replicas in one process (``MirroredStrategy``). Replicas per process: 2 + 1 on two
processes, 1 + 1 + 1 on three. One replica, ``IDLE`` (on the last process of two, the
middle one of three), awaits an event that is never set: its process has no collective
in flight, and its loop is idle, not busy. Each process logs its run's error as one
JSON line (class and fields, global ids), then what follows; the test compares them
with one process's. A hang guard dumps the stacks and exits.

Scenarios:

* ``timeout``: every process has ``timeout_seconds=0.5``; the others wait for ``IDLE``
  at an ``all_reduce``. One process raises ``CollectiveTimeoutError``; so must every
  process, the idle one included, with the same fields.
* ``error``: replica 0 raises ``ValueError`` (no timeout anywhere). One process raises
  it and cancels the others; here its process raises it, every other process raises
  the same ``ReplicaExitedError``, and a second run then gives every process the value
  one process gives (the processes stayed in step).
* ``exit``: process 0 dies of an uncaught ``ValueError`` before its run (no timeout):
  every other process raises the same ``ReplicaExitedError`` naming it.
* ``timeout shared`` and ``error shared``: the same, where the idle replica shares its
  process with a replica that waits at the collective (2 + 1 on two processes, idle
  replica 1; 1 + 1 + 2 on three, idle replica 3), and the failing replica is on another
  process (replica 2 on two processes, replica 0 on three).
* ``told``: as ``timeout`` on two processes, then the idle process goes on (awaits, its
  loop idle) past process 0's wait for its acknowledgement at exit (1 s here): process 0
  must not call it busy before the job is aborted.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import anyio
from _report import RANK, report
from mpi4py import MPI

import asyncreplica as ar

LAYOUTS = {2: (2, 1), 3: (1, 1, 1)}
IDLE = {2: 2, 3: 1}  # the global replica that awaits an event never set
# The "shared" scenarios: the idle replica shares its process with a replica that
# reaches the collective (so that process posts no exchange for it), and the replica
# that fails in "error shared" is on another process.
SHARED_LAYOUTS = {2: (2, 1), 3: (1, 1, 2)}
SHARED_IDLE = {2: 1, 3: 3}
SHARED_FAILS = {2: 2, 3: 0}
FIELDS = ("position", "timeout", "arrived", "missing", "replica_id", "waiting", "name")


def said(error: BaseException) -> dict[str, Any]:
    """The error's class, its fields (global ids) and its first line, as JSON values."""
    found: dict[str, Any] = {"class": type(error).__name__}
    for name in FIELDS:
        if hasattr(error, name):
            value = getattr(error, name)
            found[name] = sorted(value) if isinstance(value, frozenset) else value
    found["first line"] = str(error).splitlines()[0]
    return found


def strategy(processes: int, one: bool, timeout: float | None, shared: bool) -> ar.Strategy:
    options = ar.CommunicationOptions(timeout_seconds=timeout)
    layout = (SHARED_LAYOUTS if shared else LAYOUTS)[processes]
    if one:
        devices = [f"CPU:{i}" for i in range(sum(layout))]
        return ar.MirroredStrategy(
            devices, communication_options=options, stall_warning_seconds=None
        )
    devices = [f"CPU:{i}" for i in range(layout[RANK])]
    return ar.MultiWorkerMirroredStrategy(
        devices, communication_options=options, stall_warning_seconds=None
    )


async def scenario(name: str, loop: str, one: str = "", processes: str = "") -> None:
    del loop  # anyio.run's backend (see the end of the file)
    size = int(processes) if one else MPI.COMM_WORLD.Get_size()
    shared = name.endswith(" shared")
    name = name.removesuffix(" shared")
    idle = (SHARED_IDLE if shared else IDLE)[size]
    fails = SHARED_FAILS[size] if shared else 0
    if name == "told" and RANK == 0:
        from asyncreplica_mpi import _exit  # after asyncreplica (it imports the backend)

        _exit._ACK_SECONDS = 1.0  # its wait for the peers' acknowledgement at exit
    s = strategy(size, bool(one), 0.5 if name in ("timeout", "told") else None, shared)
    if name == "exit" and RANK == 0 and not one:
        raise ValueError("process 0 dies before its run")
    never = anyio.Event()

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        replica = ctx.replica_id_in_sync_group
        if replica == idle:
            await never.wait()  # no collective in flight on its process: the loop is idle
        if name == "error" and replica == fails:
            await anyio.sleep(0.2)
            raise ValueError(f"replica {fails} fails")
        return await ctx.all_reduce("SUM", 1.0)

    try:
        await s.run(step)
        report("finished")
    except Exception as exc:
        report(json.dumps(said(exc)))
    if name == "error":
        # The strategy is still usable, in step: every process gets one process's value.
        async def again() -> Any:
            ctx = ar.get_replica_context()
            assert ctx is not None
            return await ctx.all_reduce("SUM", float(ctx.replica_id_in_sync_group + 1))

        result = await s.run(again)
        values = {float(v) for v in s.experimental_local_results(result)}
        report(f"again {sorted(values)}")
    if name == "told" and RANK == 1:
        report("goes on")
        await anyio.sleep(30)  # idle, past process 0's wait: the abort ends it
        report("not reached")
    report("end")


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(float(os.environ.get("LIFECYCLE_GUARD_S", "60")), exit=True)
    anyio.run(scenario, *sys.argv[1:], backend=sys.argv[2])
