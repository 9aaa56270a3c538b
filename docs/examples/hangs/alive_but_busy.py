"""A replica that is alive but busy elsewhere: only a timeout can tell that it will not come."""

import asyncio

import asyncreplica as ar


async def step():
    ctx = ar.get_replica_context()
    if ctx.replica_id_in_sync_group == 1:
        await asyncio.sleep(30)  # a data loader that does not deliver
    return await ctx.all_reduce("sum", 1.0)


async def main():
    # Strategy-wide: every collective of this strategy waits at most 0.2 s.
    options = ar.CommunicationOptions(timeout_seconds=0.2)
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"], communication_options=options)
    try:
        await strategy.run(step)
    except ar.CollectiveTimeoutError as exc:
        error = exc
    else:
        raise SystemExit("expected CollectiveTimeoutError")
    print(error)
    assert error.missing == {1}
    assert error.arrived == {0}
    assert "alive_but_busy.py:11" in str(error)  # where replica 1 is awaiting right now

    # Per call: options= on one collective overrides the strategy's default.
    async def step_with_own_timeout():
        ctx = ar.get_replica_context()
        if ctx.replica_id_in_sync_group == 1:
            await asyncio.sleep(0.05)  # slow, but within the limit
        return await ctx.all_reduce("sum", 1.0, ar.CommunicationOptions(timeout_seconds=5.0))

    result = await strategy.run(step_with_own_timeout)
    assert [float(v) for v in strategy.experimental_local_results(result)] == [2.0, 2.0]


asyncio.run(main())
