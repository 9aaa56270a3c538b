"""A shutdown routine cancels the replicas one by one: ReplicaCancelledError."""

import asyncio

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def main():
    main_task = asyncio.current_task()

    async def step():
        ctx = ar.get_replica_context()
        await ctx.all_reduce("sum", 1.0)
        if ctx.replica_id_in_sync_group == 1:
            # BUG: "cancel every task but main" cancels each replica's task on its own,
            # not the run: no replica can return a result.
            for task in asyncio.all_tasks():
                if task is not main_task:
                    task.cancel()
        return await ctx.all_reduce("sum", 2.0)

    return await strategy.run(step)


try:
    asyncio.run(main())
except ar.ReplicaCancelledError as exc:
    error = exc
else:
    raise SystemExit("expected ReplicaCancelledError")

print(error)
assert error.how == "cancelled"
assert error.where is not None
assert error.where.endswith("in step()")
assert isinstance(error.__cause__, asyncio.CancelledError)
assert isinstance(error, ar.CollectiveError)
