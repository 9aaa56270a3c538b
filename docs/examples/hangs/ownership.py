"""A collective belongs to the replica that issues it: misuse is refused at once."""

import asyncio

import numpy as np

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


def failures(error):
    """The errors of a failed run: one replica's, or each of a group's."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in failures(inner)]
    return [error]


def run(step):
    try:
        asyncio.run(strategy.run(step))
    except (ar.AsyncReplicaError, ExceptionGroup) as exc:
        return failures(exc)
    raise SystemExit("expected the run to fail")


# Issued in a worker thread: the thread pool's frames are not the replica's call site.
async def in_a_thread():
    ctx = ar.get_replica_context()
    return await (await asyncio.to_thread(ctx.all_reduce, "sum", np.ones(2)))


assert all(isinstance(e, ar.ReplicaContextError) for e in run(in_a_thread))


# Created in one comprehension, awaited in another order by one replica: the call site
# is taken at creation, the position at the await, so the order must be the same.
async def swapped_awaits():
    ctx = ar.get_replica_context()
    g, loss = ctx.all_reduce("sum", np.ones(2)), ctx.all_reduce("sum", np.full(2, 10.0))
    if ctx.replica_id_in_sync_group == 0:
        return await g, await loss
    return await loss, await g


(error,) = run(swapped_awaits)
print(error)
assert "which it issued earlier and has not awaited" in str(error)


# Two uses of one name in flight at once would pair by arrival order.
async def one_name_twice():
    ctx = ar.get_replica_context()
    a = ctx.all_reduce("sum", np.ones(2), name="grad")
    b = ctx.all_reduce("sum", np.ones(2), name="grad")
    return await asyncio.gather(a, b)


assert all("named 'grad'" in str(e) for e in run(one_name_twice))
