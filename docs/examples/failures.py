"""Failure semantics: exits, exceptions and timeouts end the run at once; the strategy survives."""

import asyncio

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])


async def good():
    return await ar.get_replica_context().all_reduce("sum", 1.0)


async def early_exit():
    ctx = ar.get_replica_context()
    if ctx.replica_id_in_sync_group == 2:
        return None  # replica 2 skips the collective
    return await ctx.all_reduce("sum", 1.0)


async def one_raises():
    ctx = ar.get_replica_context()
    if ctx.replica_id_in_sync_group == 1:
        raise KeyError("missing feature")
    return await ctx.all_reduce("sum", 1.0)  # replicas 0 and 2 wait here, then are cancelled


async def one_is_slow():
    ctx = ar.get_replica_context()
    if ctx.replica_id_in_sync_group == 1:
        await asyncio.sleep(30)  # alive but busy; cancelled when the run fails
    options = ar.CommunicationOptions(timeout_seconds=0.1)
    return await ctx.all_reduce("sum", 1.0, options)


async def main():
    # 1. A replica returns while others wait: ReplicaExitedError, raised at once.
    try:
        await strategy.run(early_exit)
    except ar.ReplicaExitedError as exc:
        exited = exc
    print(str(exited).splitlines()[0])
    assert exited.replica_id == 2
    assert exited.position == 0
    assert exited.waiting <= {0, 1}

    # 2. A replica raises: the others are cancelled and run re-raises the same object,
    #    with a note naming the replica.
    try:
        await strategy.run(one_raises)
    except KeyError as exc:
        raised = exc
    print(repr(raised), raised.__notes__)
    assert raised.__notes__ == ["(raised in replica 1 of 3 in MirroredStrategy.run)"]

    # 3. A replica is alive but late: only timeout_seconds can tell, so it is opt-in.
    try:
        await strategy.run(one_is_slow)
    except ar.CollectiveTimeoutError as exc:
        timed_out = exc
    print(str(timed_out).splitlines()[0])
    assert timed_out.missing == {1}
    assert timed_out.arrived == {0, 2}
    assert isinstance(timed_out, TimeoutError)

    # After each failure the strategy runs again normally: nothing is poisoned.
    result = await strategy.run(good)
    print(result)
    assert [float(v) for v in result.values] == [3.0, 3.0, 3.0]


asyncio.run(main())
