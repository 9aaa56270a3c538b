"""A bug in asyncreplica (simulated here by breaking one of its helpers): InternalError."""

import asyncio

import asyncreplica as ar
from asyncreplica._runtime import _context

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])

# Stands for a bug in asyncreplica: a helper of its merge_call machinery is broken.
_context.regroup = None


async def step():
    ctx = ar.get_replica_context()
    return await ctx.merge_call(lambda strategy, value: value, args=(1.0,))


try:
    asyncio.run(strategy.run(step))
except ar.InternalError as exc:
    error = exc
else:
    raise SystemExit("expected InternalError")

print(error)
assert isinstance(error.__cause__, TypeError)  # what went wrong inside asyncreplica
assert not isinstance(error, RuntimeError)  # no handler for a run's failures catches it
assert not any("raised in replica" in note for note in getattr(error, "__notes__", ()))
