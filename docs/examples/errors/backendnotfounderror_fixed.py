"""Use a name from the error's `.available` (or leave backend= out for CPU devices)."""

import asyncio

import asyncreplica as ar
from asyncreplica.abc import available_backends

print(available_backends())
strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"], backend="numpy")


async def step():
    return await ar.get_replica_context().all_reduce("sum", 1.0)


result = asyncio.run(strategy.run(step))
assert "numpy" in available_backends()
assert [float(v) for v in strategy.experimental_local_results(result)] == [2.0, 2.0]
