"""Signal before the collective, so no replica waits on another across it."""

import asyncio

import asyncreplica as ar

strategy = ar.MirroredStrategy(
    ["CPU:0", "CPU:1"],
    communication_options=ar.CommunicationOptions(timeout_seconds=5.0),
)


async def step(ready):
    ctx = ar.get_replica_context()
    if ctx.replica_id_in_sync_group == 0:
        ready.set()
    else:
        await ready.wait()
    return await ctx.all_reduce("sum", 1.0)


async def main():
    return await strategy.run(step, args=(asyncio.Event(),))


result = asyncio.run(main())
print(result)
assert [float(v) for v in strategy.experimental_local_results(result)] == [2.0, 2.0]
