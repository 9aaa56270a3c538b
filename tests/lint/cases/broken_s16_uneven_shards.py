"""Scenario 16: each replica loops over its own shard; shards have different lengths."""

import asyncreplica as ar


async def epoch(shard):
    ctx = ar.get_replica_context()
    for i, batch in enumerate(shard):  # @cond s16
        await ctx.all_reduce("sum", batch, name=f"grad{i}")  # @flag s16
