"""Every replica passes the same keys; a replica without the value passes a neutral one."""

import asyncio

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])


async def step(loss, aux):
    ctx = ar.get_replica_context()
    has_aux = ctx.replica_id_in_sync_group == 0
    metrics = {"loss": loss, "aux": aux if has_aux else 0.0, "aux_count": float(has_aux)}
    total = await ctx.all_reduce("sum", metrics)
    return {"loss": total["loss"] / 3, "aux": total["aux"] / total["aux_count"]}


result = asyncio.run(strategy.run(step, args=(1.0, 0.5)))
print(result)
for metrics in strategy.experimental_local_results(result):
    assert float(metrics["loss"]) == 1.0
    assert float(metrics["aux"]) == 0.5
