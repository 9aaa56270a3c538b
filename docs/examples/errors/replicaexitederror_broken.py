"""Uneven shards: the replica with fewer batches finishes early. ReplicaExitedError."""

import asyncio

import numpy as np

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
# 5 batches: replica 0 gets 3, replica 1 gets 2.
shards = ar.PerReplica([[np.ones(2)] * 3, [np.ones(2)] * 2])


async def step(shard):
    ctx = ar.get_replica_context()
    total = np.zeros(2)
    for batch in shard:  # BUG: the trip count depends on the replica
        total = total + await ctx.all_reduce("sum", batch)
    return total


try:
    asyncio.run(strategy.run(step, args=(shards,)))
except ar.ReplicaExitedError as exc:
    error = exc
else:
    raise SystemExit("expected ReplicaExitedError")

print(error)
assert type(error) is ar.ReplicaExitedError
assert error.replica_id == 1  # finished after 2 collectives
assert error.position == 2  # replica 0 waits at its 3rd
assert error.waiting == {0}
