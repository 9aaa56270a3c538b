"""Pick a backend that runs here: numpy (the default for CPU devices) always does."""

import asyncio

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"], backend="numpy")


async def step():
    return await ar.get_replica_context().all_reduce("sum", 1.0)


result = asyncio.run(strategy.run(step))
print(result)
assert [float(v) for v in strategy.experimental_local_results(result)] == [2.0, 2.0]
