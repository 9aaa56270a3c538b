"""A replica waits for something that happens only after the collective: CollectiveTimeoutError.

Replica 1 is alive (it awaits an event), so nothing is certain yet: only a timeout
can end this. Without `timeout_seconds` the program would wait for ever.
"""

import asyncio

import asyncreplica as ar

strategy = ar.MirroredStrategy(
    ["CPU:0", "CPU:1"],
    communication_options=ar.CommunicationOptions(timeout_seconds=0.2),
)


async def step(ready):
    ctx = ar.get_replica_context()
    if ctx.replica_id_in_sync_group == 1:
        await ready.wait()  # BUG: replica 0 sets it only after the all_reduce
    total = await ctx.all_reduce("sum", 1.0)
    if ctx.replica_id_in_sync_group == 0:
        ready.set()
    return total


async def main():
    try:
        await strategy.run(step, args=(asyncio.Event(),))
    except ar.CollectiveTimeoutError as exc:
        return exc
    raise SystemExit("expected CollectiveTimeoutError")


error = asyncio.run(main())
print(error)
assert type(error) is ar.CollectiveTimeoutError
assert isinstance(error, TimeoutError)
assert error.arrived == {0}
assert error.missing == {1}
assert error.position == 0
assert error.timeout == 0.2
