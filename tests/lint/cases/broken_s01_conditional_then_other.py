"""Scenario 1: replica 0 makes an extra all_reduce; the others go on to all_gather."""

import numpy as np

import asyncreplica as ar


async def step(x):
    ctx = ar.get_replica_context()
    if ctx.replica_id_in_sync_group == 0:  # @cond s01
        x = await ctx.all_reduce("sum", x)  # @flag s01
    return await ctx.all_gather(np.ones(2) * x, 0)
