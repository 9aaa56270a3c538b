"""The reproducer that hangs elsewhere: a collective on replica 0 only. Raised at once here.

No timeout is configured: the errors come from what the replicas did, not from a clock.
"""

import asyncio
import time

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def others_return(x):
    ctx = ar.get_replica_context()
    if ctx.replica_id_in_sync_group == 0:
        x = await ctx.all_reduce("sum", x)  # replica 1 never makes this call
    return x


async def others_continue(x):
    ctx = ar.get_replica_context()
    if ctx.replica_id_in_sync_group == 0:
        x = await ctx.all_reduce("max", x)  # replica 1 skips it ...
    return await ctx.all_reduce("sum", x)  # ... and meets replica 0's MAX with its SUM


for step, expected in [
    (others_return, ar.ReplicaExitedError),
    (others_continue, ar.CollectiveMismatchError),
]:
    started = time.perf_counter()
    try:
        asyncio.run(strategy.run(step, args=(1.0,)))
    except expected as exc:
        error = exc
    else:
        raise SystemExit(f"expected {expected.__name__}")
    elapsed = time.perf_counter() - started
    print(f"{step.__name__}: {type(error).__name__} after {elapsed * 1000:.1f} ms")
    print(str(error).splitlines()[0])
    assert type(error) is expected
    assert elapsed < 1.0
