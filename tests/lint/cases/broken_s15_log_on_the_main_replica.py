"""Scenario 15: an extra reduction for logging on the "main" replica only."""

import asyncreplica as ar


class Trainer:
    def __init__(self, strategy):
        self.strategy = strategy

    async def step(self, metric):
        ctx = ar.get_replica_context()
        rank = ctx.replica_id_in_sync_group
        self.is_global_zero = rank % ctx.num_replicas_in_sync == 0
        total = await ctx.all_reduce("sum", metric)
        if self.is_global_zero:  # @cond s15
            mean = await ctx.all_reduce("mean", total)  # @flag s15
            print("mean metric", mean)
        return total
