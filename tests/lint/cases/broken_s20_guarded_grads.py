"""Scenario 20: only the gradients that exist on this replica are reduced."""

import asyncreplica as ar

PARAMS = ["w1", "w2", "w3"]


def compute_grads(batch):
    return {name: (None if len(batch) < i else float(i)) for i, name in enumerate(PARAMS)}


async def step(batch):
    ctx = ar.get_replica_context()
    grads = compute_grads(batch)
    for name, grad in grads.items():
        if grad is not None:  # @cond s20
            grads[name] = await ctx.all_reduce("sum", grad, name=name)  # @flag s20
    return grads
