"""Work in a thread is invisible: the replica is "awaiting" the thread, alive as far as we know."""

import asyncio
import threading

import asyncreplica as ar

strategy = ar.MirroredStrategy(
    ["CPU:0", "CPU:1"],
    communication_options=ar.CommunicationOptions(timeout_seconds=0.2),
)
lock_released = threading.Event()  # stands for a lock that another component holds


def load_shard():
    lock_released.wait(timeout=1.0)  # blocks this thread, not the event loop
    return 1.0


async def step():
    ctx = ar.get_replica_context()
    value = 1.0
    if ctx.replica_id_in_sync_group == 1:
        value = await asyncio.to_thread(load_shard)
    return await ctx.all_reduce("sum", value)


try:
    asyncio.run(strategy.run(step))
except ar.CollectiveTimeoutError as exc:
    error = exc
else:
    raise SystemExit("expected CollectiveTimeoutError")
print(error)
assert error.missing == {1}
# We can say which line of the replica awaits the thread, not what the thread waits for.
assert "thread_outside_loop.py:24" in str(error)
