"""TensorFlow's ReplicaContext example 3, made async: all_reduce of a list is one collective."""

import asyncio

import numpy as np

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def step_fn():
    ctx = ar.get_replica_context()
    value1 = np.float32(1.0)
    value2 = np.float32(2.0)
    # One rendezvous for the whole list; every replica gets a list back.
    return await ctx.all_reduce(ar.ReduceOp.SUM, [value1, value2])


local = strategy.experimental_local_results(asyncio.run(strategy.run(step_fn)))
print(local)  # ([array(2., dtype=float32), array(4., dtype=float32)], [... same ...])
assert len(local) == 2
for replica_result in local:
    assert type(replica_result) is list
    assert [float(v) for v in replica_result] == [2.0, 4.0]
