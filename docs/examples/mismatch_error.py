"""A collective inside `if` on the replica id: TensorFlow hangs or mis-pairs, we raise."""

import asyncio

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])


async def step(x):
    ctx = ar.get_replica_context()
    if ctx.replica_id_in_sync_group == 0:
        x = await ctx.all_reduce("max", x)  # only replica 0 makes this call ...
    return await ctx.all_reduce("sum", x)  # ... so it pairs with the others' SUM


try:
    asyncio.run(strategy.run(step, args=(1.0,)))
except ar.CollectiveMismatchError as exc:
    error = exc
else:
    raise AssertionError("expected CollectiveMismatchError")

print(error)  # the message: fact, one bullet per behaviour, the rule, the fix
print()
print("position:", error.position)  # the same facts, as attributes
print("fields:  ", error.fields)
print("report:")
print(error.report)  # one row per replica: state, position, last collective
assert error.position == 0
assert "reduce op" in error.fields
assert isinstance(error, RuntimeError)  # TF-style `except RuntimeError` still works


# The strategy is not poisoned: a correct step runs right after.
async def good_step(x):
    return await ar.get_replica_context().all_reduce("sum", x)


print(asyncio.run(strategy.run(good_step, args=(1.0,))))
