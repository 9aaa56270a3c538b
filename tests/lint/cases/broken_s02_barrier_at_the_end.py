"""Scenario 2: a barrier at the end that only replica 0 makes; the others return."""

import asyncreplica as ar


def rid():
    return ar.get_replica_context().replica_id_in_sync_group


async def step(x):
    ctx = ar.get_replica_context()
    total = await ctx.all_reduce("sum", x)
    is_chief = rid() == 0
    if is_chief:  # @cond s02
        await ctx.barrier()  # @flag s02
    return total
