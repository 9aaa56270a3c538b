"""What must agree: the call path too, unless a name= or check_call_sites=False says otherwise."""

import asyncio

import asyncreplica as ar


async def sync_grads(ctx, grads):
    return await ctx.all_reduce("sum", grads)


async def branchy(x):
    ctx = ar.get_replica_context()
    # Same collective, same shape, reached from two different lines.
    if ctx.replica_id_in_sync_group == 0:
        return await sync_grads(ctx, x)
    return await sync_grads(ctx, x)


async def named(x):
    ctx = ar.get_replica_context()
    if ctx.replica_id_in_sync_group == 0:
        return await ctx.all_reduce("sum", x, name="grads")
    return await ctx.all_reduce("sum", x, name="grads")


async def main():
    strict = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    try:
        await strict.run(branchy, args=(1.0,))
    except ar.CollectiveMismatchError as exc:
        error = exc
    else:
        raise AssertionError("expected CollectiveMismatchError")
    print("\n".join(str(error).splitlines()[:4]))
    assert error.fields == ("call site",)

    # A name says "these calls are the same collective": call paths are not compared.
    print(await strict.run(named, args=(1.0,)))

    # Or switch the call-path check off for the whole strategy.
    relaxed = ar.MirroredStrategy(["CPU:0", "CPU:1"], check_call_sites=False)
    result = await relaxed.run(branchy, args=(1.0,))
    assert [float(v) for v in result.values] == [2.0, 2.0]

    # Everything else must still agree, named or not: here the reduce op differs.
    async def different_op(x):
        ctx = ar.get_replica_context()
        op = "sum" if ctx.replica_id_in_sync_group == 0 else "mean"
        return await ctx.all_reduce(op, x, name="grads")

    try:
        await relaxed.run(different_op, args=(1.0,))
    except ar.CollectiveMismatchError as exc:
        error = exc
    else:
        raise AssertionError("expected CollectiveMismatchError")
    print("still checked:", error.fields)
    assert error.fields == ("reduce op",)


asyncio.run(main())
