"""Two unnamed collectives in flight at once in one replica: CollectiveError."""

import asyncio

import numpy as np

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def step(loss, grads):
    ctx = ar.get_replica_context()
    # BUG: unnamed collectives match by their order, and gather() starts both at once.
    return await asyncio.gather(
        ctx.all_reduce("mean", loss),
        ctx.all_reduce("sum", grads),
    )


try:
    asyncio.run(strategy.run(step, args=(1.0, np.ones(3))))
except ar.CollectiveError as exc:
    error = exc
else:
    raise SystemExit("expected CollectiveError")

print(error)
assert type(error) is ar.CollectiveError  # exactly the base class, not a subclass
assert "in flight" in str(error)
assert error.report is not None
