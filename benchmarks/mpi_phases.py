"""Where a large cross-process all_reduce spends its time, phase by phase.

Usage::

    mpiexec -n 2 python benchmarks/mpi_phases.py [SIZE_BYTES [ROUNDS [REPEAT]]] [--against FILE]

Each process runs 4 replicas of a ``MultiWorkerMirroredStrategy``, each with its own
random float32 input of SIZE_BYTES (default 16 MiB), and times ``ctx.all_reduce("SUM")``
with every check on, as ``asyncreplica bench --mpi`` does. Around it, in the same
processes and interleaved, it times the two parts of the floor: mpi4py's blocking
``Allreduce`` of one buffer (``raw``) and numpy's cache-blocked sum of the 4 inputs
(``local``). Inside ours it times the local backend's sum, the processes' agreement
and the cross-process combination (``_combine_leaves``: the transfer and its wait).
Wall and CPU time (this process, all threads) per round; medians of REPEAT samples of
ROUNDS rounds; the larger of the two processes' medians. CPU time is the steadier
figure on a machine that other jobs load: a wait that spins, or a second thread that
competes with the one moving the data, shows there.

``--against FILE`` also times an ``MPIBackend`` loaded from FILE (say the previous
release's ``_backend.py``: ``git show REV:backends/asyncreplica_mpi/_backend.py >
/tmp/old.py``), interleaved, and checks that its results have the same bits.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections import defaultdict
from typing import Any

import anyio
import numpy as np
from asyncreplica_mpi import _group
from mpi4py import MPI

import asyncreplica as ar
from asyncreplica._tools._bench._baselines import _blocked_sum

REPLICAS = 4

# phase -> [wall seconds, CPU seconds], summed over the rounds of one sample.
_phases: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])


def _timed(owner: Any, name: str, label: str) -> None:
    """Wrap the coroutine method ``owner.name`` to add its time to phase ``label``."""
    original = getattr(owner, name)

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return await original(*args, **kwargs)
        finally:
            phase = _phases[label]
            phase[0] += time.perf_counter() - wall
            phase[1] += time.process_time() - cpu

    setattr(owner, name, wrapper)


def _load(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("asyncreplica_mpi._against", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def main(size: int, rounds: int, repeat: int, against: str | None) -> None:
    comm = MPI.COMM_WORLD.Dup()
    strategy = ar.MultiWorkerMirroredStrategy([f"CPU:{i}" for i in range(REPLICAS)])
    current = strategy.backend
    backends = {"ours": current}
    if against:
        backends["against"] = _load(against).MPIBackend(current.inner, current.group)
    for cls in {type(b) for b in backends.values()}:
        _timed(cls, "_combine_leaves", "cross-process combine")
    _timed(_group.MPIProcessGroup, "settle", "agreement")
    _timed(current.inner, "all_reduce", "local sum (local backend)")
    count = max(size // 4, 1)
    rng = np.random.default_rng(comm.Get_rank())
    inputs = [rng.standard_normal(count).astype(np.float32) for _ in range(REPLICAS)]
    value, out = np.ones(count, np.float32), np.empty(count, np.float32)
    local = _blocked_sum(inputs)

    async def step(x: np.ndarray[Any, Any]) -> tuple[float, float, bytes]:
        ctx = ar.get_replica_context()
        assert ctx is not None
        first = await ctx.all_reduce("SUM", x)  # warm-up; its bits are compared
        if ctx.replica_id_in_sync_group == comm.Get_rank() * REPLICAS:
            _phases.clear()
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(rounds):
            await ctx.all_reduce("SUM", x)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        return wall, cpu, np.asarray(first).tobytes()

    samples: dict[str, list[list[float]]] = defaultdict(list)
    bits: dict[str, bytes] = {}

    def floor_part(label: str, work: Any) -> None:
        comm.Barrier()
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(rounds):
            work()
        samples[label].append([time.perf_counter() - wall, time.process_time() - cpu])

    floor_part("raw Allreduce", lambda: comm.Allreduce(value, out))  # warm-up
    samples.clear()
    for _ in range(repeat):
        for name, backend in backends.items():
            strategy._backend = backend  # type: ignore[attr-defined]
            comm.Barrier()
            result = strategy.experimental_local_results(
                await strategy.run(step, args=(ar.PerReplica(inputs),))
            )
            bits.setdefault(name, result[0][2])
            samples[name].append([max(r[0] for r in result), result[0][1]])
            for label, (wall, phase_cpu) in _phases.items():
                samples[f"{name}: {label}"].append([wall, phase_cpu])
        floor_part("raw Allreduce", lambda: comm.Allreduce(value, out))
        floor_part("local sum (numpy floor)", local)
    strategy._backend = current  # type: ignore[attr-defined]
    if against:
        assert bits["ours"] == bits["against"], "the two backends' results differ"
    labels = sorted(samples)
    mine = np.array(
        [[statistics.median(s[k] for s in samples[lb]) for k in (0, 1)] for lb in labels]
    )
    worst = np.empty_like(mine)
    comm.Allreduce(mine, worst, op=MPI.MAX)
    rank, processes = comm.Get_rank(), comm.Get_size()
    comm.Free()
    if rank == 0:
        print(f"{size} B x {REPLICAS} replicas x {processes} processes, {rounds} rounds x {repeat}")
        for label, (wall, cpu) in zip(labels, worst / rounds, strict=True):
            print(f"  {label:42s} wall {wall * 1e6:10.1f} us   cpu {cpu * 1e6:10.1f} us")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("size", nargs="?", type=int, default=16 << 20)
    parser.add_argument("rounds", nargs="?", type=int, default=5)
    parser.add_argument("repeat", nargs="?", type=int, default=7)
    parser.add_argument("--against", metavar="FILE")
    args = parser.parse_args()
    anyio.run(main, args.size, args.rounds, args.repeat, args.against)
