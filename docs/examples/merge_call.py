"""merge_call: pause every replica, run one function in cross-replica context, resume."""

import asyncio

import numpy as np

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
calls = []


async def merge_fn(strategy, loss, scale, *, tag):
    # Runs once, with all replicas paused at their merge_call.
    assert ar.in_cross_replica_context()
    assert ar.get_replica_context() is None
    calls.append(tag)
    print("merge_fn got", loss, "scale", scale, "tag", tag)
    # loss is a PerReplica (it differs per replica); scale and tag are the same object on
    # every replica, so they arrive unwrapped.
    total = await strategy.reduce(ar.ReduceOp.SUM, loss)  # cross-replica API, awaited
    # A plain leaf goes to every replica as it is; a PerReplica leaf gives replica i its
    # i-th component.
    return total * scale, ar.PerReplica(["first", "second"])


async def step():
    ctx = ar.get_replica_context()
    loss = np.float64(ctx.replica_id_in_sync_group + 1.0)  # 1.0 and 2.0
    total, label = await ctx.merge_call(merge_fn, args=(loss, 10.0), kwargs={"tag": "step"})
    return total, label


total, label = asyncio.run(strategy.run(step))
print("total:", total)  # one object shared by both replicas: returned unwrapped
print("label:", label)
assert calls == ["step"]  # merge_fn ran exactly once
assert float(total) == 30.0
assert not isinstance(total, ar.PerReplica)
assert label.values == ("first", "second")
