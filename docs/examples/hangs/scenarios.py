"""The bad programs of the scenario table in docs/hangs.md, each with what asyncreplica raises.

Every scenario is decided without a timeout, except 23 (a replica that is alive but
busy), which needs one. Scenario 21 is not here: it is not detected (see
docs/examples/hangs/unordered_order.py).
"""

import asyncio

import numpy as np

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])


def rid():
    return ar.get_replica_context().replica_id_in_sync_group


async def s01_conditional_then_other_collective():
    ctx = ar.get_replica_context()
    if rid() == 0:
        await ctx.all_reduce("sum", 1.0)
    return await ctx.all_gather(np.ones(2), 0)


async def s02_conditional_collective_others_return():
    ctx = ar.get_replica_context()
    await ctx.all_reduce("sum", 1.0)
    if rid() == 0:
        await ctx.barrier()


async def s03_skipped_collective_same_signature():
    ctx = ar.get_replica_context()
    if rid() != 1:
        await ctx.all_reduce("sum", np.ones(4))  # replica 1 skips this one ...
    await ctx.all_reduce("sum", np.ones(4))  # ... and pairs this one with it


async def s04_swapped_order_different_shapes():
    ctx = ar.get_replica_context()
    if rid() == 0:
        await ctx.all_reduce("sum", np.ones(4))
        await ctx.all_reduce("sum", np.ones(8))
    else:
        await ctx.all_reduce("sum", np.ones(8))
        await ctx.all_reduce("sum", np.ones(4))


async def s05_swapped_order_same_shapes():
    ctx = ar.get_replica_context()
    a, b = np.ones(4), np.full(4, 2.0)
    if rid() == 0:
        await ctx.all_reduce("sum", a)
        await ctx.all_reduce("sum", b)
    else:
        await ctx.all_reduce("sum", b)
        await ctx.all_reduce("sum", a)


async def s06_different_shapes():
    return await ar.get_replica_context().all_reduce("sum", np.ones(4 + (rid() == 2)))


async def s07_different_dtypes():
    dtype = np.float16 if rid() == 1 else np.float32
    return await ar.get_replica_context().all_reduce("sum", np.ones(4, dtype))


async def s08_different_reduce_ops():
    op = "sum" if rid() == 0 else "mean"
    return await ar.get_replica_context().all_reduce(op, 1.0)


async def s09_different_broadcast_sources():
    return await ar.get_replica_context().broadcast(np.ones(2), source=rid() % 2)


def merge_fn(strategy, value):
    return value


def other_merge_fn(strategy, value):
    return value


async def s10_merge_call_vs_all_reduce():
    ctx = ar.get_replica_context()
    if rid() == 0:
        return await ctx.merge_call(merge_fn, args=(1.0,))
    return await ctx.all_reduce("sum", 1.0)


async def s11_different_merge_fns():
    fn = merge_fn if rid() == 0 else other_merge_fn
    return await ar.get_replica_context().merge_call(fn, args=(1.0,))


async def s12_different_kinds():
    ctx = ar.get_replica_context()
    x = np.ones(2)
    calls = [
        lambda: ctx.all_reduce("sum", x),
        lambda: ctx.all_gather(x, 0),
        lambda: ctx.broadcast(x),
    ]
    return await calls[rid()]()


async def s13_early_return():
    if rid() == 2:
        return None  # e.g. `if loss is None: return`
    return await ar.get_replica_context().all_reduce("sum", 1.0)


async def s14_exception_in_one_replica():
    if rid() == 1:
        raise KeyError("missing feature")
    return await ar.get_replica_context().all_reduce("sum", 1.0)


async def s15_extra_collective_after_others_finished():
    ctx = ar.get_replica_context()
    total = await ctx.all_reduce("sum", 1.0)
    if rid() == 0:  # "log on the main replica"
        await ctx.all_reduce("mean", total)
    return total


async def s16_replica_dependent_trip_counts():
    ctx = ar.get_replica_context()
    for _ in range(3 + (rid() == 0)):  # uneven last batch
        await ctx.all_reduce("sum", np.ones(2))


async def s17_nested_structure_differs():
    metrics = {"loss": 1.0}
    if rid() in (0, 2):
        metrics["aux"] = 0.5
    return await ar.get_replica_context().all_reduce("mean", metrics)


async def s18_deep_leaf_shape_differs():
    width = 9 if rid() == 1 else 8
    grads = {"layer3": {"w": np.ones((8, width)), "b": np.ones(8)}}
    return await ar.get_replica_context().all_reduce("sum", grads)


async def s19_data_dependent_collective_count():
    ctx = ar.get_replica_context()
    routed = [[0, 1, 2], [1], [0, 2]][rid()]  # experts this replica routed tokens to
    for _expert in routed:
        await ctx.all_gather(np.ones((2, 4)), 0)


async def s20_guarded_collectives():
    ctx = ar.get_replica_context()
    grads = {"w1": np.ones(3), "w2": None if rid() == 1 else np.ones(3), "w3": np.ones(3)}
    for g in grads.values():
        if g is not None:
            await ctx.all_reduce("sum", g)


async def s22_unnamed_collectives_in_flight_together():
    ctx = ar.get_replica_context()
    return await asyncio.gather(ctx.all_reduce("sum", 1.0), ctx.all_reduce("sum", 2.0))


async def s23_alive_but_busy():
    ctx = ar.get_replica_context()
    if rid() == 1:
        await asyncio.sleep(30)  # a data loader that never delivers
    options = ar.CommunicationOptions(timeout_seconds=0.1)
    return await ctx.all_reduce("sum", 1.0, options)


async def s24_run_cancelled_from_outside():
    if rid() == 1:
        await asyncio.sleep(30)
    return await ar.get_replica_context().all_reduce("sum", 1.0)


Mismatch, Exited = ar.CollectiveMismatchError, ar.ReplicaExitedError
# scenario -> (the exception raised, the fields that differ for a mismatch)
EXPECTED = {
    s01_conditional_then_other_collective: (Mismatch, {"kind"}),
    s02_conditional_collective_others_return: (Exited, None),
    s03_skipped_collective_same_signature: (Mismatch, {"call site"}),
    s04_swapped_order_different_shapes: (Mismatch, {"shape", "call site"}),
    s05_swapped_order_same_shapes: (Mismatch, {"call site"}),
    s06_different_shapes: (Mismatch, {"shape"}),
    s07_different_dtypes: (Mismatch, {"dtype"}),
    s08_different_reduce_ops: (Mismatch, {"reduce op"}),
    s09_different_broadcast_sources: (Mismatch, {"source"}),
    s10_merge_call_vs_all_reduce: (Mismatch, {"kind"}),
    s11_different_merge_fns: (Mismatch, {"merge_fn"}),
    s12_different_kinds: (Mismatch, {"kind"}),
    s13_early_return: (Exited, None),
    s14_exception_in_one_replica: (KeyError, None),
    s15_extra_collective_after_others_finished: (Exited, None),
    s16_replica_dependent_trip_counts: (Exited, None),
    s17_nested_structure_differs: (Mismatch, {"structure"}),
    s18_deep_leaf_shape_differs: (Mismatch, {"shape"}),
    s19_data_dependent_collective_count: (Exited, None),
    s20_guarded_collectives: (Exited, None),
    s22_unnamed_collectives_in_flight_together: (ar.CollectiveError, None),
    s23_alive_but_busy: (ar.CollectiveTimeoutError, None),
}


async def main():
    loop = asyncio.get_running_loop()
    for scenario, (expected, fields) in EXPECTED.items():
        started = loop.time()
        try:
            await strategy.run(scenario)
        except Exception as exc:
            error = exc
        else:
            raise AssertionError(f"{scenario.__name__}: nothing was raised")
        elapsed = loop.time() - started
        detail = f" {error.fields}" if isinstance(error, Mismatch) else ""
        print(f"{scenario.__name__:45} {type(error).__name__}{detail} in {elapsed:.3f} s")
        assert type(error) is expected, (scenario.__name__, error)
        if fields is not None:
            assert fields <= set(error.fields), (scenario.__name__, error.fields)
        # Only the timeout scenario waits for a clock; the others are decided at once.
        assert elapsed < (1.0 if expected is ar.CollectiveTimeoutError else 0.5)

    # 24: cancelling the run from outside cancels every replica and leaves no task behind.
    try:
        await asyncio.wait_for(strategy.run(s24_run_cancelled_from_outside), 0.1)
    except TimeoutError:
        pass
    else:
        raise AssertionError("s24: expected the outer timeout")
    assert asyncio.all_tasks() == {asyncio.current_task()}
    print(f"{'s24_run_cancelled_from_outside':45} every replica cancelled, no task left")


asyncio.run(main())
