"""Await one collective after the other (the order is then the same on every replica)."""

import asyncio

import numpy as np

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def step(loss, grads):
    ctx = ar.get_replica_context()
    mean_loss = await ctx.all_reduce("mean", loss)
    total = await ctx.all_reduce("sum", grads)
    return mean_loss, total


mean_loss, total = asyncio.run(strategy.run(step, args=(1.0, np.ones(3))))
print(mean_loss, total, sep="\n")
for value in strategy.experimental_local_results(mean_loss):
    assert float(value) == 1.0
for value in strategy.experimental_local_results(total):
    assert value.tolist() == [2.0, 2.0, 2.0]
