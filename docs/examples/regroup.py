"""How run regroups results: containers rebuilt, identical objects unwrapped, the rest PerReplica."""

import asyncio
from typing import NamedTuple

import numpy as np

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
SHARED = object()


class Stats(NamedTuple):
    loss: object
    step: int


async def step(x):
    ctx = ar.get_replica_context()
    total = await ctx.all_reduce("sum", x)
    return {
        "id": ctx.replica_id_in_sync_group,  # differs per replica -> PerReplica
        "const": 7,  # the same object on every replica -> 7
        "shared": SHARED,  # the same object -> unwrapped
        "total": total,  # equal values, but one view per replica -> PerReplica
        "stats": Stats(loss=x * 2, step=1),  # containers are rebuilt, namedtuples too
    }


async def main():
    x = np.array([1.0, 2.0])
    out = await strategy.run(step, args=(x,))
    print(out)
    assert type(out) is dict
    assert out["id"].values == (0, 1)
    assert out["const"] == 7
    assert out["shared"] is SHARED
    assert isinstance(out["total"], ar.PerReplica)
    assert type(out["stats"]) is Stats
    assert out["stats"].step == 1

    # experimental_local_results: one entry per replica, nests picked apart per replica.
    first, second = strategy.experimental_local_results(out)
    assert first["id"] == 0
    assert second["id"] == 1

    # The replicas' results are read-only views of ONE buffer.
    a, b = out["total"].values
    assert a is not b
    assert np.shares_memory(a, b)
    assert not a.flags.writeable
    try:
        a[0] = 0.0
    except ValueError as exc:
        print("writing to a result:", exc)
    mine = a.copy()  # take a private, writable copy when you need one
    mine[0] = 0.0

    # Inputs are never modified.
    assert x.tolist() == [1.0, 2.0]

    # One replica: no PerReplica at all (TF's regroup is the identity for one replica).
    single = ar.MirroredStrategy(["CPU:0"])
    assert await single.run(lambda: ar.get_replica_context().replica_id_in_sync_group) == 0


asyncio.run(main())
