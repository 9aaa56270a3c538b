"""The three contexts -- default, cross-replica, replica -- and how code moves between them."""

import asyncio

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


def where():
    """Name the current context, and return the replica context and strategy too."""
    ctx = ar.get_replica_context()
    if ar.in_cross_replica_context():
        kind = "cross-replica"  # ctx is None
    elif ar.has_strategy():
        kind = "replica"  # ctx is this replica's ReplicaContext
    else:
        kind = "default"  # ctx is the default replica context
    return kind, ctx, ar.get_strategy()


async def main():
    seen = {}

    # Default context: the default strategy and its one-replica context.
    kind, ctx, current = where()
    seen["top level"] = kind
    assert ctx.replica_id_in_sync_group == 0
    assert current is not strategy
    assert await ctx.all_reduce("sum", 3) == 3  # identity: one replica, no arithmetic

    # Cross-replica context: inside strategy.scope().
    with strategy.scope():
        kind, ctx, current = where()
        seen["strategy.scope()"] = kind
        assert ctx is None
        assert current is strategy

    def merge_fn(s):
        seen["merge_fn"] = where()[0]
        assert ar.get_strategy() is s

    async def step():
        kind, ctx, current = where()
        seen[f"replica {ctx.replica_id_in_sync_group}"] = kind
        assert current is strategy
        await ctx.merge_call(merge_fn)  # replica -> cross-replica -> back
        seen[f"replica {ctx.replica_id_in_sync_group}, after merge_call"] = where()[0]

    await strategy.run(step)  # run from the default context enters the strategy itself
    seen["after run"] = where()[0]

    expected = {
        "top level": "default",
        "strategy.scope()": "cross-replica",
        "replica 0": "replica",
        "replica 1": "replica",
        "merge_fn": "cross-replica",
        "replica 0, after merge_call": "replica",
        "replica 1, after merge_call": "replica",
        "after run": "default",
    }
    for place in expected:
        print(f"{place:30} {seen[place]}")
    assert seen == expected


asyncio.run(main())
