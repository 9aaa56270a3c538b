"""The same program with every replica making the collective: no AsyncReplicaError."""

import asyncio

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def step(x):
    ctx = ar.get_replica_context()
    return await ctx.all_reduce("sum", x)  # every replica makes it


try:
    result = asyncio.run(strategy.run(step, args=(1.0,)))
except ar.AsyncReplicaError as exc:
    raise SystemExit(f"unexpected {type(exc).__name__}: {exc}") from exc

print(result)
assert [float(v) for v in strategy.experimental_local_results(result)] == [2.0, 2.0]
