"""Collectives and reduce ops that tf.distribute does not have."""

import asyncio

import numpy as np

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def step():
    ctx = ar.get_replica_context()
    r = ctx.replica_id_in_sync_group
    value = np.array([1.0, 2.0, 3.0, 4.0]) * (r + 1)  # [1, 2, 3, 4] and [2, 4, 6, 8]

    # reduce_scatter: sum, then replica i keeps chunk i of the result along axis 0.
    chunk = await ctx.reduce_scatter("sum", value, axis=0)
    # broadcast: every replica gets replica 1's value (each passes one of the same shape).
    weights = await ctx.broadcast(value, source=1)
    # barrier: wait until every replica gets here.
    await ctx.barrier()
    # MIN, MAX and PROD work wherever SUM and MEAN do.
    low = await ctx.all_reduce(ar.ReduceOp.MIN, value)
    high = await ctx.all_reduce("max", value)
    prod = await ctx.all_reduce("prod", value)
    return chunk, weights, low, high, prod


chunk, weights, low, high, prod = asyncio.run(strategy.run(step))
print("reduce_scatter:", chunk)
print("broadcast:     ", weights.values[0])
print("min/max/prod:  ", low.values[0], high.values[0], prod.values[0])
assert [c.tolist() for c in chunk.values] == [[3.0, 6.0], [9.0, 12.0]]
assert all(w.tolist() == [2.0, 4.0, 6.0, 8.0] for w in weights.values)
assert low.values[0].tolist() == [1.0, 2.0, 3.0, 4.0]
assert high.values[0].tolist() == [2.0, 4.0, 6.0, 8.0]
assert prod.values[0].tolist() == [2.0, 8.0, 18.0, 32.0]
