"""Agree on the number of steps first, and contribute zeros once out of data."""

import asyncio

import numpy as np

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
shards = ar.PerReplica([[np.ones(2)] * 3, [np.ones(2)] * 2])


async def step(shard):
    ctx = ar.get_replica_context()
    steps = int(await ctx.all_reduce("max", len(shard)))  # the same on every replica
    total = np.zeros(2)
    for i in range(steps):
        batch = shard[i] if i < len(shard) else np.zeros(2)
        total = total + await ctx.all_reduce("sum", batch)
    return total


result = asyncio.run(strategy.run(step, args=(shards,)))
print(result)
for total in strategy.experimental_local_results(result):
    assert total.tolist() == [5.0, 5.0]  # all 5 batches counted once
