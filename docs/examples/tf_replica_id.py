"""TensorFlow's ReplicaContext example 1, made async: each replica's id."""

import asyncio

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])  # TF: ["GPU:0", "GPU:1"]


async def func():
    replica_context = ar.get_replica_context()
    return replica_context.replica_id_in_sync_group


result = asyncio.run(strategy.run(func))
print(result)
# PerReplica:{
#   0: 0,
#   1: 1
# }
assert isinstance(result, ar.PerReplica)
assert result.values == (0, 1)  # Python ints (TF gives int32 tensors)
