"""TensorFlow's ReplicaContext example 2, made async: all_reduce of 1.0 over two replicas."""

import asyncio

import numpy as np

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def step_fn():
    ctx = ar.get_replica_context()
    value = np.float32(1.0)  # TF: tf.identity(1.)
    return await ctx.all_reduce(ar.ReduceOp.SUM, value)


local = strategy.experimental_local_results(asyncio.run(strategy.run(step_fn)))
print(local)  # (array(2., dtype=float32), array(2., dtype=float32))
assert len(local) == 2
for value in local:
    assert value == 2.0
    assert value.dtype == np.float32  # the dtype is kept
    assert value.shape == ()  # scalars come back as 0-d arrays
