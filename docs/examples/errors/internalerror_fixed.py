"""Nothing to fix in your program: report the bug. Let InternalError through your handlers."""

import asyncio

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def step():
    return await ar.get_replica_context().all_reduce("sum", 1.0)


async def main():
    try:
        return await strategy.run(step)
    except ar.InternalError:
        raise  # a bug in asyncreplica: let it through, and report it
    except ar.AsyncReplicaError as error:
        print(f"the run failed: {type(error).__name__}")  # your program's to handle
        return None


result = asyncio.run(main())
print(result)
assert [float(v) for v in strategy.experimental_local_results(result)] == [2.0, 2.0]
