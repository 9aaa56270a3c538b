"""Replicas pass different structures to one all_reduce: CollectiveMismatchError."""

import asyncio

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])


async def step(loss, aux):
    ctx = ar.get_replica_context()
    metrics = {"loss": loss}
    if ctx.replica_id_in_sync_group == 0:
        metrics["aux"] = aux  # BUG: only replica 0 reports "aux"
    return await ctx.all_reduce("mean", metrics)


try:
    asyncio.run(strategy.run(step, args=(1.0, 0.5)))
except ar.CollectiveMismatchError as exc:
    error = exc
else:
    raise SystemExit("expected CollectiveMismatchError")

print(error)
print("position:", error.position, "fields:", error.fields)
assert type(error) is ar.CollectiveMismatchError
assert error.position == 0
# The leaves are compared one by one too, so dtype and shape differ as well.
assert "structure" in error.fields
assert set(error.signatures) <= {0, 1, 2}
