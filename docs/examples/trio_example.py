"""The same library under Trio: trio.run drives the replicas, no asyncio involved."""

import numpy as np
import trio

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def step(values):
    ctx = ar.get_replica_context()
    await trio.sleep(0.01 * ctx.replica_id_in_sync_group)  # any Trio code runs in a replica
    total = await ctx.all_reduce("sum", values)
    gathered = await ctx.all_gather(values, axis=0)
    return total, gathered


async def main():
    per_replica = ar.PerReplica([np.array([1.0, 2.0]), np.array([10.0, 20.0])])
    total, gathered = await strategy.run(step, args=(per_replica,))
    print("total:", total)
    print("gathered:", gathered)
    for t, g in zip(total.values, gathered.values, strict=True):
        assert t.tolist() == [11.0, 22.0]
        assert g.tolist() == [1.0, 2.0, 10.0, 20.0]


trio.run(main)
