"""Await every collective you create."""

import asyncio

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def step(x):
    ctx = ar.get_replica_context()
    await ctx.barrier()
    return x * 2


result = asyncio.run(strategy.run(step, args=(1.0,)))
print(result)
assert strategy.experimental_local_results(result) == (2.0, 2.0)
