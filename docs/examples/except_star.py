"""Several replicas may fail: `except*` handles one exception and an ExceptionGroup alike."""

import asyncio

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])


async def step():
    ctx = ar.get_replica_context()
    await ctx.barrier()
    if ctx.replica_id_in_sync_group > 0:
        raise ValueError(f"bad batch on replica {ctx.replica_id_in_sync_group}")
    await ctx.barrier()


async def main():
    caught = []
    try:
        await strategy.run(step)
    except* ValueError as group:
        for exc in group.exceptions:
            print(exc, exc.__notes__)
            caught.append(exc)
    # One or two of replicas 1 and 2 fail before the cancellation reaches the other.
    assert 1 <= len(caught) <= 2
    assert all(str(exc).startswith("bad batch on replica") for exc in caught)


asyncio.run(main())
