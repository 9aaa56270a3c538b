"""The shortest complete program: two replicas sum a value with all_reduce."""

import asyncio

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def step(x):
    ctx = ar.get_replica_context()
    return await ctx.all_reduce(ar.ReduceOp.SUM, x)  # every replica must make this call


result = asyncio.run(strategy.run(step, args=(1.0,)))
local = strategy.experimental_local_results(result)
print(local)  # (array(2.), array(2.)): one read-only 0-d array per replica
assert [float(v) for v in local] == [2.0, 2.0]
