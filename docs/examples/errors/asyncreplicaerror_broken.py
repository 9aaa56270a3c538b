"""One handler for every error asyncreplica raises on purpose, and not for your own bugs."""

import asyncio

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def step(x):
    ctx = ar.get_replica_context()
    if ctx.replica_id_in_sync_group == 0:
        return x  # BUG: replica 0 skips the all_reduce below
    return await ctx.all_reduce("sum", x)


try:
    asyncio.run(strategy.run(step, args=(1.0,)))
except ar.AsyncReplicaError as exc:  # catches every asyncreplica error, whatever its base
    error = exc
else:
    raise SystemExit("expected an AsyncReplicaError")

print(f"{type(error).__name__}: {error}")
assert isinstance(error, ar.AsyncReplicaError)
assert type(error) is not ar.AsyncReplicaError  # the base class itself is never raised
assert isinstance(error, ar.ReplicaExitedError)
# Errors of the library and errors of your program are told apart by the base class:
assert not issubclass(KeyError, ar.AsyncReplicaError)
assert issubclass(ar.BackendNotFoundError, LookupError)  # not a RuntimeError ...
assert issubclass(ar.BackendNotFoundError, ar.AsyncReplicaError)  # ... but still caught here
