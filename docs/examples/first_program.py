"""A first program: per-replica data in, collectives inside, one reduced result out."""

import asyncio

import numpy as np

import asyncreplica as ar


async def step(batch):
    ctx = ar.get_replica_context()
    print(
        f"replica {ctx.replica_id_in_sync_group} of {ctx.num_replicas_in_sync} "
        f"on {ctx.devices[0]} got {batch}"
    )
    local_sum = batch.sum()
    # Both collectives are awaited, and every replica makes them in the same order.
    global_sum = await ctx.all_reduce(ar.ReduceOp.SUM, local_sum)
    count = await ctx.all_reduce(ar.ReduceOp.SUM, len(batch))
    return batch - global_sum / count  # centre this replica's data on the global mean


async def main():
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    # A PerReplica argument gives replica i its i-th component; other arguments are
    # passed to every replica unchanged.
    batch = ar.PerReplica([np.array([1.0, 2.0, 3.0]), np.array([4.0, 5.0, 6.0])])
    centred = await strategy.run(step, args=(batch,))
    print(centred)

    # Back outside the replicas (cross-replica context): combine the per-replica results.
    total = await strategy.reduce(ar.ReduceOp.SUM, centred, axis=0)
    print("sum of centred values:", total)
    assert float(total) == 0.0
    assert [c.tolist() for c in strategy.experimental_local_results(centred)] == [
        [-2.5, -1.5, -0.5],
        [0.5, 1.5, 2.5],
    ]


asyncio.run(main())
