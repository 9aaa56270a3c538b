"""Scenario 21: the same call site, the same shapes, a replica-dependent order. Not detected.

Every field of the signature agrees, so the replicas pair different buffers and the
results are wrong without an error. Sort the keys (or use names, see errors.md).
"""

import asyncio

import numpy as np

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
buffers = ar.PerReplica([{"a": np.ones(2), "b": np.full(2, 10.0)}] * 2)
# A set's iteration order may differ between processes; here it differs by replica.
orders = ar.PerReplica([["a", "b"], ["b", "a"]])


async def step(buffers, order, fixed):
    ctx = ar.get_replica_context()
    keys = sorted(order) if fixed else order
    return {key: await ctx.all_reduce("sum", buffers[key]) for key in keys}


broken = asyncio.run(strategy.run(step, args=(buffers, orders, False)))
fixed = asyncio.run(strategy.run(step, args=(buffers, orders, True)))
replica0 = strategy.experimental_local_results(broken)[0]
print("unsorted, replica 0:", {k: v.tolist() for k, v in replica0.items()})
assert replica0["a"].tolist() == [11.0, 11.0]  # wrong: a + b, and no error
for result in strategy.experimental_local_results(fixed):
    assert result["a"].tolist() == [2.0, 2.0]
    assert result["b"].tolist() == [20.0, 20.0]
