"""One step function for GPUs (CuPy arrays) and, where there is none, CPUs (numpy)."""

import anyio
import numpy as np
from asyncreplica_cupy import visible_gpu_count

import asyncreplica as ar

if visible_gpu_count():
    import cupy as xp

    devices = ["GPU:0", "GPU:0"]  # two replicas sharing GPU 0
else:
    xp = np  # the same code on CPU replicas
    devices = ["CPU:0", "CPU:1"]

strategy = ar.MirroredStrategy(devices)


async def step() -> object:
    ctx = ar.get_replica_context()
    grad = xp.full(4, ctx.replica_id_in_sync_group + 1.0, dtype=xp.float32)
    return await ctx.all_reduce(ar.ReduceOp.MEAN, grad)


result = anyio.run(lambda: strategy.run(step))
for component in strategy.experimental_local_results(result):
    assert isinstance(component, xp.ndarray)  # CuPy arrays on a GPU replica
    np.testing.assert_array_equal(xp.asnumpy(component) if xp is not np else component, [1.5] * 4)
print(f"{type(strategy.backend).name}: mean of 1 and 2 is 1.5 on", devices)
