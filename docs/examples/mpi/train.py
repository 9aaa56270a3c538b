"""Data-parallel steps across MPI processes: run with ``mpiexec -n 2 python train.py``.

Process 0 runs two replicas and process 1 one: replica ids are global (0, 1 | 2).
"""

import asyncio
import importlib.util
import os
import shutil
import subprocess
import sys

import numpy as np

import asyncreplica as ar


async def step(x):
    ctx = ar.get_replica_context()
    grads = x * (ctx.replica_id_in_sync_group + 1)
    total = await ctx.all_reduce("SUM", grads)  # over every replica of every process
    mean = await ctx.all_reduce("MEAN", grads)  # divided by the global count, 3
    return total, mean


async def main():
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    devices = ["CPU:0", "CPU:1"] if rank == 0 else ["CPU:0"]
    strategy = ar.MultiWorkerMirroredStrategy(devices)
    assert strategy.num_replicas_in_sync == 3
    total, mean = await strategy.run(step, args=(np.ones(2),))
    for t, m in zip(
        strategy.experimental_local_results(total),
        strategy.experimental_local_results(mean),
        strict=True,
    ):
        assert t.tolist() == [6.0, 6.0]  # 1 + 2 + 3
        assert m.tolist() == [2.0, 2.0]
    # Cross-replica reductions span every process too.
    result = await strategy.reduce("SUM", total, axis=None)
    print(f"process {rank}: sum {result}\n", end="", flush=True)


if __name__ == "__main__":
    if "PMI_RANK" in os.environ:  # started by mpiexec: one of the processes
        asyncio.run(main())
    else:  # started by hand: launch two processes of this file
        mpiexec = shutil.which(
            "mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
        )
        if mpiexec is None or importlib.util.find_spec("mpi4py") is None:
            missing = "mpiexec" if mpiexec is None else "mpi4py"
            print(
                f"train.py: {missing} is missing: pip install 'asyncreplica[mpi]'", file=sys.stderr
            )
            raise SystemExit(2)
        done = subprocess.run(
            [mpiexec, "-n", "2", sys.executable, __file__], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        assert "process 0: sum [18. 18.]" in done.stdout, done.stdout
        assert "process 1: sum [18. 18.]" in done.stdout, done.stdout
        print(done.stdout, end="")
