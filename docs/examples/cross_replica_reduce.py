"""Cross-replica reductions: Strategy.reduce, Strategy.gather and extended.reduce_to."""

import asyncio

import numpy as np

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def per_example_loss(batch):
    return batch * 1.0  # stands in for a model's per-example losses


async def main():
    # Replica 0 holds [0, 1, 2, 3]; replica 1 holds [4, 5] (an uneven last batch).
    batch = ar.PerReplica([np.arange(4), np.arange(4, 6)])
    losses = await strategy.run(per_example_loss, args=(batch,))
    print(losses)

    # axis=0 reduces inside each replica too; MEAN divides by the global count (6).
    mean = await strategy.reduce(ar.ReduceOp.MEAN, losses, axis=0)
    total = await strategy.reduce("sum", losses, axis=0)
    print("mean:", mean, "sum:", total)
    assert float(mean) == 2.5
    assert float(total) == 15.0

    gathered = await strategy.gather(losses, axis=0)
    print("gathered:", gathered)
    assert gathered.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]

    # axis=None combines element-wise across replicas: the shapes must agree.
    same = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.full(2, ctx.replica_id_in_sync_group + 1.0)
    )
    summed = await strategy.reduce("sum", same, axis=None)
    print("element-wise sum:", summed)
    assert summed.tolist() == [3.0, 3.0]

    # reduce_to a distributed value (or a list of devices) gives a Mirrored result;
    # reduce_to one device gives one array.
    mirrored = await strategy.extended.reduce_to("sum", same, same)
    one = await strategy.extended.reduce_to("sum", same, "CPU:0")
    print(mirrored, one)
    assert isinstance(mirrored, ar.Mirrored)
    assert [v.tolist() for v in mirrored.values] == [[3.0, 3.0], [3.0, 3.0]]
    assert one.tolist() == [3.0, 3.0]

    # Cross-replica APIs refuse to run inside a replica. Every replica fails here, so
    # run may raise one error or an ExceptionGroup of them: except* handles both.
    async def wrong():
        return await strategy.reduce("sum", same)

    try:
        await strategy.run(wrong)
    except* ar.ReplicaContextError as group:
        print("inside a replica:", str(group.exceptions[0])[:60], "...")
    else:
        raise AssertionError("expected ReplicaContextError")


asyncio.run(main())
