"""Named collectives awaited in different orders wait for each other: CollectiveDeadlockError."""

import asyncio

import numpy as np

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def step(buffers, order):
    ctx = ar.get_replica_context()
    results = {}
    for name in order:  # BUG: the order depends on the replica
        results[name] = await ctx.all_reduce("sum", buffers[name], name=name)
    return results


buffers = {"weights": np.ones(4), "bias": np.ones(4)}
orders = ar.PerReplica([["weights", "bias"], ["bias", "weights"]])
try:
    asyncio.run(strategy.run(step, args=(buffers, orders)))
except ar.CollectiveDeadlockError as exc:
    error = exc
else:
    raise SystemExit("expected CollectiveDeadlockError")

print(error)
print("cycle:", error.cycle)
assert type(error) is ar.CollectiveDeadlockError
assert isinstance(error, ar.CollectiveError)
waits = dict(error.cycle)  # replica id -> the collective it waits at
assert set(waits) == {0, 1}
assert "weights" in waits[0]
assert "bias" in waits[1]
