"""Scenario 20, fixed: every parameter is reduced; a missing gradient counts as zero."""

import asyncreplica as ar

PARAMS = ["w1", "w2", "w3"]


def compute_grads(batch):
    return {name: (None if len(batch) < i else float(i)) for i, name in enumerate(PARAMS)}


async def step(batch):
    ctx = ar.get_replica_context()
    grads = compute_grads(batch)
    for name in PARAMS:  # the same list on every replica
        grad = grads[name] if grads[name] is not None else 0.0
        grads[name] = await ctx.all_reduce("sum", grad, name=name)
    return grads
