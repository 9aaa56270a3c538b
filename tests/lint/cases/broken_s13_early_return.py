"""Scenario 13: a replica whose loss is missing returns before the gradient all_reduce."""

import asyncreplica as ar


def compute(batch):
    return None if len(batch) == 0 else sum(batch)


async def step(batch):
    ctx = ar.get_replica_context()
    loss = compute(batch)
    if loss is None:  # @cond s13
        return None
    grad = loss * 2.0
    return await ctx.all_reduce("sum", grad)  # @flag s13
