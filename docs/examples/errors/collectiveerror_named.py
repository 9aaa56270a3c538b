"""Named collectives may be in flight together: they match by name, not by order."""

import asyncio

import numpy as np

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def step(loss, grads):
    ctx = ar.get_replica_context()
    return await asyncio.gather(
        ctx.all_reduce("mean", loss, name="loss"),
        ctx.all_reduce("sum", grads, name="grads"),
    )


mean_loss, total = asyncio.run(strategy.run(step, args=(1.0, np.ones(3))))
print(mean_loss, total, sep="\n")
for value in strategy.experimental_local_results(mean_loss):
    assert float(value) == 1.0
for value in strategy.experimental_local_results(total):
    assert value.tolist() == [2.0, 2.0, 2.0]
