"""Issue named collectives in one order on every replica (sorted), or all at once."""

import asyncio

import numpy as np

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def step(buffers, order):
    ctx = ar.get_replica_context()
    results = {}
    for name in sorted(order):  # the same order everywhere
        results[name] = await ctx.all_reduce("sum", buffers[name], name=name)
    return results


buffers = {"weights": np.ones(4), "bias": np.ones(4)}
orders = ar.PerReplica([["weights", "bias"], ["bias", "weights"]])
result = asyncio.run(strategy.run(step, args=(buffers, orders)))
print(result)
for results in strategy.experimental_local_results(result):
    assert results["weights"].tolist() == [2.0] * 4
    assert results["bias"].tolist() == [2.0] * 4
