"""To stop a run, cancel the task that awaits strategy.run: every replica stops together."""

import asyncio

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def main():
    stop = asyncio.Event()

    async def step():
        ctx = ar.get_replica_context()
        await ctx.all_reduce("sum", 1.0)
        if ctx.replica_id_in_sync_group == 1:
            stop.set()  # asks for a shutdown
        await asyncio.Event().wait()  # stands for work that the shutdown interrupts

    run = asyncio.create_task(strategy.run(step))
    await stop.wait()
    run.cancel()  # the run, not its replicas one by one
    try:
        await run
    except asyncio.CancelledError:
        return "the run was cancelled as a whole"
    return "the run completed"


outcome = asyncio.run(main())
print(outcome)
assert outcome == "the run was cancelled as a whole"
