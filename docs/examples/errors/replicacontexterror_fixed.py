"""Inside a replica use the ReplicaContext's collective; outside, strategy.reduce."""

import asyncio

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def step(x):
    return await ar.get_replica_context().all_reduce("sum", x)  # replica context


async def main():
    per_replica = await strategy.run(lambda: ar.get_replica_context().replica_id_in_sync_group)
    total = await strategy.reduce("sum", per_replica, axis=None)  # cross-replica context
    summed = await strategy.run(step, args=(1.0,))
    return total, summed


total, summed = asyncio.run(main())
print(total, summed)
assert float(total) == 1.0  # 0 + 1
assert [float(v) for v in strategy.experimental_local_results(summed)] == [2.0, 2.0]
