"""A cross-replica API called inside a replica: ReplicaContextError."""

import asyncio

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def step(x):
    # BUG: strategy.reduce belongs to cross-replica context, not to a replica.
    return await strategy.reduce("sum", x, axis=None)


try:
    asyncio.run(strategy.run(step, args=(1.0,)))
except ar.ReplicaContextError as exc:
    error = exc
else:
    raise SystemExit("expected ReplicaContextError")

print(error)
assert type(error) is ar.ReplicaContextError
assert isinstance(error, RuntimeError)
