"""A replica that never yields blocks the event loop: no check and no timeout can run meanwhile."""

import asyncio
import time

import asyncreplica as ar

strategy = ar.MirroredStrategy(
    ["CPU:0", "CPU:1"],
    communication_options=ar.CommunicationOptions(timeout_seconds=0.1),
)


async def step():
    ctx = ar.get_replica_context()
    if ctx.replica_id_in_sync_group == 1:
        time.sleep(0.3)  # noqa: ASYNC251 - blocking on purpose: it holds the whole loop
    return await ctx.all_reduce("sum", 1.0)


started = time.perf_counter()
result = asyncio.run(strategy.run(step))
elapsed = time.perf_counter() - started
print(f"completed after {elapsed:.2f} s, although the timeout is 0.1 s")
# Replica 0's 0.1 s timeout could not fire while replica 1 held the loop; replica 1
# then arrived before the loop checked the clock, so the collective completed.
assert elapsed >= 0.3
assert [float(v) for v in strategy.experimental_local_results(result)] == [2.0, 2.0]
